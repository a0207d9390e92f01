import sys

from stowplan.cli import main

sys.exit(main())
