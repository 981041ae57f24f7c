import sys

from dsec.cli.main import main

sys.exit(main())
