"""Versioned prompt texts (a package only so that they install with Viano)."""
