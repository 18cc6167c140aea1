"""Environment stage: what a runner is, and how two runners differ."""
