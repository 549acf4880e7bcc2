"""app/db.py: storage of the small shop application used by the PLAN benchmark."""


def storage_1(record: dict, limit: int = 10) -> dict:
    """Return the storage record 1, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"storage record 1 is too large: {len(record)}")
    return {**record, "checked_1": True}


def storage_2(record: dict, limit: int = 20) -> dict:
    """Return the storage record 2, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"storage record 2 is too large: {len(record)}")
    return {**record, "checked_2": True}


def storage_3(record: dict, limit: int = 30) -> dict:
    """Return the storage record 3, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"storage record 3 is too large: {len(record)}")
    return {**record, "checked_3": True}


def storage_4(record: dict, limit: int = 40) -> dict:
    """Return the storage record 4, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"storage record 4 is too large: {len(record)}")
    return {**record, "checked_4": True}


def storage_5(record: dict, limit: int = 50) -> dict:
    """Return the storage record 5, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"storage record 5 is too large: {len(record)}")
    return {**record, "checked_5": True}


def storage_6(record: dict, limit: int = 60) -> dict:
    """Return the storage record 6, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"storage record 6 is too large: {len(record)}")
    return {**record, "checked_6": True}
