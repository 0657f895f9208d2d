"""`python -m experiments.study`."""

from .main import main

raise SystemExit(main())
