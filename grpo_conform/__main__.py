"""`python3 -m grpo_conform` runs the CLI (used on machines where the package is not installed)."""

from grpo_conform.cli import main

if __name__ == "__main__":
    main()
