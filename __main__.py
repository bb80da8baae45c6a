"""gpu-serving: one strategy stack (tp8, pp8, ep8, ...) of an SGLang deployment. See README."""
import gc

from components.provider_start import start_provider_early

# First: the provider process starts while the program below loads (components/provider_start.py).
start_provider_early()

# The imports below build thousands of long-lived objects (the settings models, the providers'
# classes) and no garbage: the cyclic collector would only walk them again and again (~13% of
# their time, docs/benchmarks.md). It collects as usual once they are loaded, and not them.
gc.disable()
try:
    from components.program import run
finally:
    gc.freeze()
    gc.enable()

run()
