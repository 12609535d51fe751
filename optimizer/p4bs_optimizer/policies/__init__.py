"""Buffer-sizing policies, one module each, behind `base.Policy`."""
