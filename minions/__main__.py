"""``python -m minions``: the `minions` command without the installed script."""

from minions.cli import main

main()
