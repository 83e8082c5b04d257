"""Input checks that run before anything is started or written (one ``error:`` line each)."""
