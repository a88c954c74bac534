"""``python -m service.settings --markdown``: print docs/settings.md, generated from the settings' models."""

import argparse

from service.settings.markdown import COMMAND, render

parser = argparse.ArgumentParser(prog="python -m service.settings", description=__doc__)
parser.add_argument("--markdown", action="store_true", required=True, help=f"print the page ({COMMAND})")
parser.parse_args()
print(render(), end="")
