"""The inventory: Ansible's YAML inventory format, read the way Ansible reads it.

``load_inventory(path)`` gives an :class:`Inventory` of :class:`Host` objects whose
variables are resolved with Ansible's precedence; ``Inventory.select(pattern)`` takes
Ansible host patterns. :data:`VARIABLES` is the registry of every variable mlxops reads.
"""

from mlxops.inventory.loader import load_inventory
from mlxops.inventory.model import Group, Host, Inventory
from mlxops.inventory.variables import VARIABLES, Invalid, Variable, register

__all__ = ["VARIABLES", "Group", "Host", "Inventory", "Invalid", "Variable", "load_inventory",
           "register"]
