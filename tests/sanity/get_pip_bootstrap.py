# Offline stand-in for the pip bootstrap script that ansible-test fetches from its own file server (unreachable
# here). ansible-test runs it as get-pip.py: bootstrap pip into a fresh virtual environment, then install the
# packages named on the command line. The interpreter's own ensurepip does the first part, pip (with the
# machine's index configuration) the rest.
import subprocess
import sys

subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade", "--default-pip"])
args = [a for a in sys.argv[1:] if a not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *args]))
