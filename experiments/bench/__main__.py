"""`python -m experiments.bench`."""

from .main import main

raise SystemExit(main())
