from kimiaudio.cli import main

raise SystemExit(main())
