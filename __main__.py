"""gpu-serving: one strategy stack (tp8, pp8, ep8, ...) of an SGLang deployment. See README."""
from components.program import run

run()
