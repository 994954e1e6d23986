"""Serving economics: a variant folder behind a real server (Ray Serve), a measured load
driven at it (MLPerf LoadGen's server scenario over HTTP), and the capacity and cost plan
those figures give for the recipe's traffic."""
