"""python -m pydsz.cli: the dsz command."""
import sys

from pydsz.cli import main

sys.exit(main())
