"""`python -m etlab.inspector --etdump_path P [--etrecord_path R] [--debug_buffer_path B]`"""

import sys

from etlab.inspector._cli import module_main

sys.exit(module_main())
