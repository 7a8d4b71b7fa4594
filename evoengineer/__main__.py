from evoengineer.cli import main

raise SystemExit(main())
