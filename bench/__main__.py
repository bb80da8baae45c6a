"""`python -m bench [options]` (bench/run installs what it needs first); `python -m bench report
FILE.json` prints the tables of a results file again."""
import json
import sys

from .runner import main, render

if len(sys.argv) > 2 and sys.argv[1] == "report":
    print(render(json.loads(open(sys.argv[2]).read())))
    sys.exit(0)
sys.exit(main())
