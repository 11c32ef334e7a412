# sandcall's matplotlib backend: Agg, whose show() saves each open figure as
# plot_N.png in the working directory (so it comes back as an output file) and closes
# it. A figure still open at exit that was never shown or saved is saved the same way.
# Every save is capped at MAX_DPI. Selected by sandcall_site when MPLBACKEND is Agg.
import atexit
import os

from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

MAX_DPI = 200
WORK_DIR = "/mnt/data"

FigureCanvas = FigureCanvasAgg
FigureManager = FigureManagerBase

_next = [0]
_original_savefig = Figure.savefig


def _capped_savefig(self, *args, **kwargs):
    import matplotlib

    dpi = kwargs.get("dpi")
    if dpi is None:
        dpi = matplotlib.rcParams["savefig.dpi"]
    if dpi == "figure":
        dpi = self.dpi
    try:
        kwargs["dpi"] = min(float(dpi), MAX_DPI)
    except (TypeError, ValueError):
        pass
    self._sandcall_saved = True
    return _original_savefig(self, *args, **kwargs)


Figure.savefig = _capped_savefig


def _path():
    folder = WORK_DIR if os.path.isdir(WORK_DIR) else os.getcwd()
    while True:
        path = os.path.join(folder, "plot_%d.png" % _next[0])
        _next[0] += 1
        if not os.path.exists(path):
            return path


def _save_open(only_unsaved):
    import matplotlib.pyplot as plt

    for num in plt.get_fignums():
        fig = plt.figure(num)
        if not (only_unsaved and getattr(fig, "_sandcall_saved", False)):
            fig.savefig(_path())
        plt.close(fig)


def show(*args, **kwargs):
    _save_open(only_unsaved=False)


@atexit.register
def _at_exit():
    try:
        _save_open(only_unsaved=True)
    except Exception:
        pass
