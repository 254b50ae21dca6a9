"""What every job shares.

Atomic files and JSON (fileio), the progress line, the CPU and its facts measured once per machine
(cpu, machine), precision rules, unit rows and exact scores (similarity), fetching weights (hub,
download).
"""
