import sys

from comfyfleet.cli import main

sys.exit(main())
