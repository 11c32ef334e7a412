# sandcall's start-up hook for the managed Python runtime, imported at the start of every
# run by sandcall.pth (a .pth line, not sitecustomize: Debian's own sitecustomize comes
# first on sys.path and would shadow one here). It only sets where matplotlib looks:
#   - the Agg backend becomes sandcall's (sandcall_mpl): plt.show() saves plot_N.png;
#   - on the first import of matplotlib, MPLCONFIGDIR becomes a fresh writable directory
#     under /tmp whose font list is a link to the one `sandcall runtime install` built,
#     so no run rebuilds it (nor prints the font-cache or Fontconfig messages that
#     rebuilding costs). Programs that never import matplotlib see nothing of this.
# It must stay cheap (it runs before every program) and import nothing heavy.
import os
import sys


def _link_font_cache():
    cache = os.path.join(sys.prefix, "mplcache")
    config = os.path.join(os.environ.get("TMPDIR") or "/tmp", ".sandcall-matplotlib")
    try:
        os.makedirs(config, exist_ok=True)
        for name in os.listdir(cache):
            link = os.path.join(config, name)
            if not os.path.lexists(link):
                os.symlink(os.path.join(cache, name), link)
        os.environ["MPLCONFIGDIR"] = config
    except OSError:
        pass


class _OnMatplotlib:
    """A meta-path finder that only watches for matplotlib's first import."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "matplotlib":
            if _OnMatplotlib in sys.meta_path:
                sys.meta_path.remove(_OnMatplotlib)
            _link_font_cache()
        return None


if os.environ.get("MPLCONFIGDIR") is None:
    sys.meta_path.insert(0, _OnMatplotlib)
if os.environ.get("MPLBACKEND", "").lower() == "agg":
    os.environ["MPLBACKEND"] = "module://sandcall_mpl"
