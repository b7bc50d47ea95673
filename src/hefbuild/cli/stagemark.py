"""The mark a hefbuild stage task carries in its doit `meta` (`{"hefbuild": STAGE}`): the
reporter and the preflight tell stages from groups, aliases, locks, images and keeps by it."""

STAGE = "stage"
