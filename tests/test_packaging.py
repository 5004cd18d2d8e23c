"""setup.cfg ships every package of the source tree: a package missing from
``packages`` (or a list setuptools cannot read) installs a cuprope that
fails on import outside the checkout."""
import configparser
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_setup_cfg_lists_every_package_one_per_line():
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    raw = cfg["options"]["packages"]
    # setuptools reads a multi-line value line by line: one name a line, no commas
    listed = [line.strip() for line in raw.strip().splitlines()]
    assert all(name and "," not in name and " " not in name for name in listed), listed
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "cuprope").rglob("__init__.py")}
    assert set(listed) == found | {"cuprope.kernels"}, sorted(set(listed) ^ (found | {"cuprope.kernels"}))
    assert (ROOT / "kernels" / "__init__.py").exists()
