"""app/config.py: settings of the small shop application used by the PLAN benchmark."""


def settings_1(record: dict, limit: int = 10) -> dict:
    """Return the settings record 1, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"settings record 1 is too large: {len(record)}")
    return {**record, "checked_1": True}


def settings_2(record: dict, limit: int = 20) -> dict:
    """Return the settings record 2, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"settings record 2 is too large: {len(record)}")
    return {**record, "checked_2": True}


def settings_3(record: dict, limit: int = 30) -> dict:
    """Return the settings record 3, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"settings record 3 is too large: {len(record)}")
    return {**record, "checked_3": True}


def settings_4(record: dict, limit: int = 40) -> dict:
    """Return the settings record 4, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"settings record 4 is too large: {len(record)}")
    return {**record, "checked_4": True}


def settings_5(record: dict, limit: int = 50) -> dict:
    """Return the settings record 5, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"settings record 5 is too large: {len(record)}")
    return {**record, "checked_5": True}


def settings_6(record: dict, limit: int = 60) -> dict:
    """Return the settings record 6, checked against its limit."""
    if len(record) > limit:
        raise ValueError(f"settings record 6 is too large: {len(record)}")
    return {**record, "checked_6": True}
