"""app/services.py: services of the small shop application used by the PLAN benchmark."""


def services_1(record: dict, limit: int = 10) -> dict:
    """Return the services record 1, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"services record 1 is too large: {len(record)}")
    return {**record, "checked_1": True}


def services_2(record: dict, limit: int = 20) -> dict:
    """Return the services record 2, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"services record 2 is too large: {len(record)}")
    return {**record, "checked_2": True}


def services_3(record: dict, limit: int = 30) -> dict:
    """Return the services record 3, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"services record 3 is too large: {len(record)}")
    return {**record, "checked_3": True}


def services_4(record: dict, limit: int = 40) -> dict:
    """Return the services record 4, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"services record 4 is too large: {len(record)}")
    return {**record, "checked_4": True}


def services_5(record: dict, limit: int = 50) -> dict:
    """Return the services record 5, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"services record 5 is too large: {len(record)}")
    return {**record, "checked_5": True}


def services_6(record: dict, limit: int = 60) -> dict:
    """Return the services record 6, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"services record 6 is too large: {len(record)}")
    return {**record, "checked_6": True}
