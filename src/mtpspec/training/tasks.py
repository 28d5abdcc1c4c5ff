"""What the target is asked to write: openers for self-written user turns, document kinds for
the two-stage recipe, the requests made over those documents, and follow-up turns.

The on-device workloads (notification and message summaries, proofreading, rewriting, smart
replies, short answers, code completion) mostly act on a passage the user already has. A head
trained only on short self-written questions never sees a long passage in its context, so the
document recipe has the target first write the passage (an article, an email, a chat thread,
notes, notifications, code) and then answer a request about it. Everything here is plain data
and pure functions of a `random.Random`, so a data run is reproducible from its seed.
"""

from __future__ import annotations

import random
import re

# Openers for a short user turn. The target continues each one, so the prompt's content is its own.
TASK_OPENERS: dict[str, list[str]] = {
    "summarize": [
        "Summarize these notifications in one sentence:\n",
        "Summarize this message thread briefly:\n",
        "Give me a short summary of this email:\n",
        "TL;DR of the following article:\n",
        "Summarize the key points of this news story:\n",
    ],
    "proofread": [
        "Proofread this text and fix any mistakes:\n",
        "Correct the grammar and spelling in this sentence:\n",
        "Fix the typos in my message:\n",
    ],
    "rewrite": [
        "Rewrite this message to sound more polite:\n",
        "Make this text more concise:\n",
        "Rewrite this in a friendly, casual tone:\n",
        "Paraphrase the following paragraph:\n",
    ],
    "reply": [
        "Suggest three short replies to this message:\n",
        "How should I reply to this text from my friend?\n",
        "Write a quick response to this email:\n",
    ],
    "chat": [
        "",
        "What is",
        "How do I",
        "Can you explain",
        "Why does",
        "Give me some tips for",
        "Write a short story about",
        "Write a poem about",
    ],
    "code": [
        "Complete this Python function:\n```python\ndef ",
        "Write a Python function that",
        "Fix the bug in this code:\n```python\n",
        "Write a JavaScript function to",
        "Explain what this code does:\n```python\n",
    ],
    "extract": [
        "Extract the names and dates from this text:\n",
        "List the action items from this message:\n",
    ],
    "translate": [
        "Translate this sentence into French:\n",
        "Translate the following into English:\n",
    ],
    "math": [
        "Solve this math problem step by step:\n",
        "A word problem:",
    ],
    "qa": [
        "Answer the question using the context below.\nContext:",
        "Who was",
        "When did",
    ],
}

# Stage 1 of the document recipe: the target completes one of these user turns (its topic is the
# target's own) and its answer becomes the passage of stage 2.
DOCUMENT_OPENERS: dict[str, list[str]] = {
    "article": ["Write a short news article about", "Write a blog post about", "Write an encyclopedia entry about"],
    "email": ["Write an email to a coworker about", "Write an email to a customer about", "Write a letter to a friend about"],
    "thread": ["Write a group chat conversation between three friends about", "Write a text message exchange about"],
    "notes": ["Write meeting notes about", "Write a to-do list for", "Write a short report on"],
    "notifications": ["Write six short phone notifications from different apps about",
                      "Write a list of reminders and alerts for a busy day of"],
    "story": ["Write a short story about", "Write a personal diary entry about"],
    "review": ["Write a product review of", "Write a restaurant review of"],
    "howto": ["Write step-by-step instructions for", "Explain in a few paragraphs how to"],
    "code": ["Write a Python function that", "Write a Python class that", "Write a JavaScript function that",
             "Write a small Python script that"],
}

_PROSE_REQUESTS = {
    "summarize": ["Summarize this in one sentence.", "Give me a TL;DR.", "Summarize the key points as a short bulleted list.",
                  "Write a two-sentence summary."],
    "qa": ["What is the main point of this text?", "Who is involved, and what do they want?",
           "What should the reader do next, according to this text?", "What happened, in short?"],
    "extract": ["List the names, dates and places mentioned.", "List the action items.", "Extract the key facts as a list."],
    "rewrite": ["Rewrite this more concisely.", "Rewrite this in a friendlier tone.", "Rewrite this more formally.",
                "Paraphrase this in simple words."],
    "proofread": ["Proofread this text and fix the mistakes.", "Correct the spelling and grammar."],
    "translate": ["Translate this into French.", "Translate this into Spanish.", "Translate this into German."],
}
_MESSAGE_REQUESTS = {
    "reply": ["Write a short reply.", "Suggest three short replies.", "Write a polite reply that says no."],
    "summarize": ["Summarize these messages in one sentence.", "What do I need to know from this? Be brief."],
}
_CODE_REQUESTS = {
    "complete": ["Complete this code.", "Finish this function."],
    "explain": ["Explain what this code does.", "Describe this code in two sentences."],
    "comment": ["Add comments to this code.", "Add a docstring and type hints to this code."],
    "test": ["Write unit tests for this code."],
    "review": ["Suggest improvements to this code."],
}

FOLLOW_UPS = [
    "Make it shorter.", "Can you make it more formal?", "Put that in bullet points.",
    "Thanks! Can you explain that in simpler words?", "Give me one more example.", "Translate that into Spanish.",
    "Now write it as a short text message.", "Can you add a title?", "Why?", "What else should I know?",
]


def is_repetitive(text: str, min_lines: int = 6) -> bool:
    """A passage that loops line by line (numbered lists of one item, repeated paragraphs): not
    worth a request over it."""
    lines = [re.sub(r"[\d\W_]+", "", ln) for ln in text.splitlines() if ln.strip()]
    return len(lines) >= min_lines and len(set(lines)) < 0.5 * len(lines)


def add_typos(text: str, rng: random.Random, rate: float = 0.08) -> str:
    """Misspell about `rate` of the words (swap, drop or double a letter): a passage to proofread."""
    def typo(m: re.Match[str]) -> str:
        w = m.group(0)
        if len(w) < 4 or rng.random() >= rate:
            return w
        i = rng.randrange(1, len(w) - 1)
        op = rng.randrange(3)
        if op == 0:
            return w[:i] + w[i + 1] + w[i] + w[i + 2:]
        if op == 1:
            return w[:i] + w[i + 1:]
        return w[:i] + w[i] + w[i:]
    return re.sub(r"[A-Za-z]+", typo, text)


def first_paragraph(text: str, max_chars: int = 500) -> str:
    para = next((p for p in text.split("\n\n") if len(p.strip()) > 20), text).strip()
    return para[:max_chars]


def code_prefix(text: str, rng: random.Random) -> str:
    """The first fenced code block (or the text) cut after 30-70% of its lines: code to complete."""
    m = re.search(r"```[a-zA-Z]*\n(.*?)(```|$)", text, re.S)
    code = m.group(1) if m else text
    lines = code.rstrip().split("\n")
    cut = max(1, round(len(lines) * rng.uniform(0.3, 0.7)))
    return "\n".join(lines[:cut]) + "\n"


def request_over(kind: str, document: str, rng: random.Random) -> str:
    """A user turn that asks for something about `document` (written by the target as a `kind`)."""
    if kind == "code":
        task = rng.choice(sorted(_CODE_REQUESTS))
        ask = rng.choice(_CODE_REQUESTS[task])
        body = code_prefix(document, rng) if task == "complete" else document
        return f"{ask}\n\n{body}"
    table = dict(_PROSE_REQUESTS)
    if kind in ("email", "thread", "notifications"):
        table.update(_MESSAGE_REQUESTS)
    task = rng.choice(sorted(table))
    ask = rng.choice(table[task])
    if task == "proofread":
        body = add_typos(document, rng)
    elif task == "translate":
        body = first_paragraph(document)
    else:
        body = document
    return f"{ask}\n\n{body}" if rng.random() < 0.5 else f"{body}\n\n{ask}"
