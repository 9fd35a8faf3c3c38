"""Maintenance scripts of this repository; not part of the installed package."""
