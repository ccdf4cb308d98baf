import sys

from dpcomm.cli.main import main

sys.exit(main())
