"""The fleet: plan the fan-out over runner pools, merge the shards, compare runners."""
