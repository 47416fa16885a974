"""`python -m jitship ARGS...` runs the jitship binary with ARGS (see jitship.main)."""

from jitship import main

if __name__ == "__main__":
    main()
