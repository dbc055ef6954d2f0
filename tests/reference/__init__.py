"""Small pure-Python reference models used as test oracles."""
