"""Notifications: a job's ``notify:`` (:mod:`.config`) and their delivery (:mod:`.deliver`)."""
