"""Settings, from the environment."""

import os

DATABASE = os.environ.get("SHOP_DATABASE", "shop.db")
SECRET_KEY = os.environ.get("SHOP_SECRET_KEY", "")
