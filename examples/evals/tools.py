"""The tool of the capital recipe: a small atlas."""

from minions import tool

ATLAS = {"france": "Paris", "japan": "Tokyo", "peru": "Lima", "kenya": "Nairobi"}


@tool
def lookup_capital(country: str) -> str:
    """The capital of a country, from the atlas."""
    return ATLAS.get(country.strip().lower(), "unknown")
