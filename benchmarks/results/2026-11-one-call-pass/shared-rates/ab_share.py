"""`../ab.py` with SHARE=1: every LogitSpec proposer in the process learns into one set of acceptance rates, as
`shared_rates` (the default since) does; measured on the tree before that option existed (SHARE=0: the rates
per request, as it was). Same arguments as `ab.py`; SRC picks the source tree."""
import os
import runpy
import sys
from pathlib import Path

sys.path.insert(0, os.environ.get("SRC", "src"))
import specdec.proposers.logitspec.proposer as logitspec  # noqa: E402

if os.environ.get("SHARE") == "1":
    shared = {}
    made = logitspec.LogitSpecProposer.__init__

    def sharing(self, *args, **kwargs):
        made(self, *args, **kwargs)
        self.stats = shared.setdefault("stats", self.stats)

    logitspec.LogitSpecProposer.__init__ = sharing
runpy.run_path(str(Path(__file__).parent.parent / "ab.py"), run_name="__main__")
