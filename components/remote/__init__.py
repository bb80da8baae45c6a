"""Code that talks to hosts: the SSH transport and the Pulumi dynamic providers built on it."""
