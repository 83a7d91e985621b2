"""A calculator-tool math agent trained with agl (see README.md)."""
