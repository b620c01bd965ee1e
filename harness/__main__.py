"""``python -m harness``: the same CLI as the ``syncbn-harness`` script."""

from harness.entry import main

if __name__ == "__main__":
    main()
