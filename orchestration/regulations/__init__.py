"""Regulations carried out on the lake, the landing files and every other store of the data dir."""
