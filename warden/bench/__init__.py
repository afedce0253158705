"""Benchmarks of warden's components, run by `warden bench …` and by the scripts in `bench/`.

They live in the package (not only in `bench/`) so an installed warden can measure itself on
the machine it will run on: the numbers that matter are the operator's, not the developer's.
"""
