"""``mlxops init``: from a few Macs (found over mDNS or named) to a checked inventory and a
starter job (docs/cli.md, "mlxops init"; docs/inventory.md, "What mlxops init writes").

Rooms: :mod:`.discover` (Bonjour ``_ssh._tcp`` through zeroconf), :mod:`.hosts` (what the
user typed or picked, and the names hosts get), :mod:`.probe` (one command per host after
its key is trusted), :mod:`.links` (each node's interfaces, their kinds and the data
address: a pure rule), :mod:`.writer` (the inventory, comments kept on a re-run),
:mod:`.starter` (the job sized by the trainer's memory plan), :mod:`.drafts` (the draft
inventory hosts are opened by, whole or a host at a time), :mod:`.pipeline` (each host's
key and probe from its mDNS answer on, consent given up front) and :mod:`.flow` (one run:
draft, keys, probes, files). The command itself (mlxops/cli/init.py) shows the keys, asks,
and prints.
"""
