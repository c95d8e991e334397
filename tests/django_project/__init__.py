"""A minimal Django project for tests/test_contrib_django.py: settings, one app."""
