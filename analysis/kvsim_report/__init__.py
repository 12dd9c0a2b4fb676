"""kvsim's report: plots of sweep, verify, agreement, serving and trace files in one HTML page.

`kvsim report INPUTS... -o report.html` runs `python -m kvsim_report` (this package, on the
project venv's Python). Modules: `readers` (file kinds, pandas readers, input errors), `plots`
(one function per figure), `page` (the self-contained HTML and one PNG per figure).
"""

from .readers import InputError, read_inputs  # noqa: F401
from .page import build_report  # noqa: F401
