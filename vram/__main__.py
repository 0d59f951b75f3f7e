"""`python -m vram ...`: see vram.cli."""

from vram.cli import main

raise SystemExit(main())
