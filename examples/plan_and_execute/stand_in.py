"""A stand-in for a language model, used to make this example's recording offline.

No model runs on the machine that builds minions, so ``recording.json`` was made by this
function (``python examples/plan_and_execute/run.py --stand-in --record``): as the planner it
answers with the plan below; as a step it answers with artifacts built from what its prompt
holds. Record a real model with ``run.py --model MODEL --record``.
"""

from __future__ import annotations

import json
import re

from minions import Prompt

PLAN = {
    "id": "user-management",
    "description": "Add users and authentication to the shop",
    "steps": [
        {
            "id": "analyze",
            "type": "analyze",
            "goal": "Study the shop's records and storage; say what a user system must add.",
            "inputs": ["README.md", "app/models.py"],
            "artifacts": ["analysis"],
        },
        {
            "id": "user_model",
            "type": "generate",
            "goal": "Write app/users.py: a User record and its SQLite table, in the style of "
            "app/db.py.",
            "inputs": ["app/db.py"],
            "depends_on": ["analyze"],
            "artifacts": ["app/users.py"],
        },
        {
            "id": "auth",
            "type": "generate",
            "goal": "Write app/auth.py: password hashing and login for the User record, with "
            "the secret from app/config.py.",
            "inputs": ["app/config.py"],
            "depends_on": ["user_model"],
            "artifacts": ["app/auth.py"],
        },
        {
            "id": "api",
            "type": "generate",
            "goal": "Write app/user_routes.py: register and login routes in the style of "
            "app/api.py.",
            "inputs": ["app/api.py"],
            "depends_on": ["user_model"],
            "artifacts": ["app/user_routes.py"],
        },
        {
            "id": "validate",
            "type": "validate",
            "goal": "Check that the routes call the auth functions as they are defined.",
            "depends_on": ["auth", "api"],
            "artifacts": ["review"],
        },
        {
            "id": "cleanup",
            "type": "cleanup",
            "goal": "Summarise what was added and what is left, for the release notes.",
            "depends_on": ["validate"],
            "artifacts": ["summary"],
        },
    ],
}

FILES = {
    "user_model": (
        "app/users.py",
        '"""Users: a record and its table."""\n\n'
        "from dataclasses import dataclass\n\n"
        'SCHEMA = "CREATE TABLE IF NOT EXISTS users '
        '(id INTEGER PRIMARY KEY, email TEXT UNIQUE, password_hash TEXT)"\n\n\n'
        "@dataclass\nclass User:\n    id: int\n    email: str\n    password_hash: str\n",
    ),
    "auth": (
        "app/auth.py",
        '"""Passwords and login."""\n\n'
        "import hashlib\nimport hmac\n\nfrom app.config import SECRET_KEY\n\n\n"
        "def hash_password(password: str) -> str:\n"
        "    return hmac.new(SECRET_KEY.encode(), password.encode(), hashlib.sha256).hexdigest()\n"
        "\n\ndef check_password(password: str, password_hash: str) -> bool:\n"
        "    return hmac.compare_digest(hash_password(password), password_hash)\n",
    ),
    "api": (
        "app/user_routes.py",
        '"""Routes for users."""\n\n'
        "from app.auth import check_password, hash_password\n\n\n"
        "def register(email: str, password: str) -> tuple[int, dict]:\n"
        '    return 201, {"email": email, "password_hash": hash_password(password)}\n\n\n'
        "def login(email: str, password: str, password_hash: str) -> tuple[int, dict]:\n"
        "    if not check_password(password, password_hash):\n"
        '        return 401, {"error": "wrong email or password"}\n'
        '    return 200, {"email": email}\n',
    ),
}


def reply(prompt: Prompt) -> str:
    """The planner's plan, or a step's artifacts."""
    if prompt.step_id == "plan":
        return json.dumps(PLAN)
    step = prompt.step_id or ""
    text = prompt.messages[-1].content
    seen = re.findall(r"^File (\S+):", text, re.M)
    earlier = re.findall(r"^From step (\S+):", text, re.M)
    answer: dict[str, object] = {
        "text": f"{step}: worked from {', '.join(seen) or 'no files'}"
        + (f" and the results of {', '.join(earlier)}" if earlier else "")
        + "."
    }
    if step in FILES:
        path, content = FILES[step]
        answer["files"] = [{"path": path, "content": content}]
    if step == "analyze":
        answer["data"] = {"entities": ["User"], "fields": ["email", "password_hash"]}
    if step == "validate":
        answer["data"] = {"problems": []}
    return json.dumps(answer)
