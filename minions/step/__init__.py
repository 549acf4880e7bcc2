"""The step layer: one step's model ⇄ tool loop, its completion chain and its record."""
