"""``mlxops init``: from a few Macs (found over mDNS or named) to a checked inventory and a
starter job (docs/cli.md, "mlxops init"; docs/inventory.md, "What init writes").

Rooms: :mod:`.discover` (Bonjour ``_ssh._tcp`` through zeroconf), :mod:`.links` (each
node's interfaces, their kinds and the data address: a pure rule), :mod:`.probe` (one
command per host after its key is trusted), :mod:`.writer` (the inventory, comments kept
on a re-run) and :mod:`.starter` (the job sized by the trainer's memory plan). The command
itself (mlxops/cli/init.py) only strings them together.
"""
