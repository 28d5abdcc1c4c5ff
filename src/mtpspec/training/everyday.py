"""Everyday requests, the way people write them: assembled from templates, not by the target.

The target's self-written user turns (`tasks.TASK_OPENERS`) read like a model's: generic,
without the names, times, amounts and app names that fill a phone's notifications and
messages. Heads trained on them gained on held-out self-written prompts and hardly at all on
people's prompts (`reports/acceptance/gap/`, `reports/heads/head-v9/`). These requests are made from slot-filled
templates (people, apps, times, places, errands), so the answers the target writes to them (the
training text) are its answers to requests shaped like its users'. The answers stay the
target's own; only the request is assembled here.

Every function is a pure function of a `random.Random`, so a data run is reproducible from its
seed. No sentence here is taken from an evaluation set (Spec-Bench, the built-in prompts).
"""

from __future__ import annotations

import random
import re

from .tasks import add_typos

NAMES = ["Alex", "Maya", "Sam", "Priya", "Tom", "Lena", "Omar", "Chloe", "Ben", "Aisha", "Lucas", "Mei", "Jonas",
         "Sofia", "Raj", "Emma", "Diego", "Hannah", "Kofi", "Yuki", "Noah", "Zoe", "Ivan", "Grace", "Leo", "Nadia",
         "Marco", "Ruth", "Felix", "Amara", "Jack", "Ines", "Kai", "Laura", "Tariq", "Julia"]
FAMILY = ["Mom", "Dad", "Grandma", "my sister", "my brother", "my boss", "the landlord", "my neighbor", "the babysitter"]
DAYS = ["today", "tonight", "tomorrow", "on Monday", "on Tuesday", "on Wednesday", "on Thursday", "on Friday",
        "on Saturday", "on Sunday", "this weekend", "next week"]
TIMES = ["7am", "8:30", "9:15", "10am", "noon", "12:30", "1pm", "2:45", "3pm", "4:30", "5pm", "6pm", "6:30", "7pm",
         "8pm", "9:30pm"]
PLACES = ["the cafe on Main Street", "the library", "the gym", "the office", "the train station", "the park", "Lena's place",
          "the pizza place", "the school gate", "the clinic", "the airport", "the supermarket", "the cinema"]
EVENTS = ["the team meeting", "dinner", "the dentist appointment", "yoga class", "the parent-teacher meeting",
          "the football match", "band practice", "the job interview", "the book club", "the haircut", "the car service",
          "the birthday party", "the project review", "the flat viewing"]
MEALS = ["lunch", "dinner", "coffee", "breakfast", "a quick drink", "brunch"]
GROCERIES = ["milk", "bread", "eggs", "bananas", "coffee beans", "rice", "tomatoes", "dish soap", "cat food",
             "batteries", "some cheese", "toilet paper"]
ITEMS = ["headphones", "running shoes", "phone charger", "desk lamp", "backpack", "coffee maker", "book", "jacket",
         "printer ink", "yoga mat", "umbrella", "water bottle"]
STORES = ["City Grocer", "QuickFuel", "BookNook", "Corner Bakery", "TechHub", "FreshFarm", "Metro Pharmacy"]
TOPICS = ["the rent", "the holiday plans", "the report", "the car", "Dad's birthday", "the new schedule", "the budget",
          "the kids' school trip", "moving house", "the wedding"]
CHORES = ["water the plants", "take out the recycling", "pay the electricity bill", "call the plumber",
          "renew the passport", "book the vet", "return the library books", "pick up the dry cleaning",
          "send the invoice", "charge the car"]
COUNTRIES = ["Canada", "Japan", "Kenya", "Brazil", "Norway", "Egypt", "India", "Mexico", "Spain", "Vietnam", "Peru",
             "Turkey", "Poland", "Chile", "Ghana"]
# Template slots drawn from a list; {money} and {n} are drawn as numbers.
SLOTS = {"name": NAMES, "family": FAMILY, "day": DAYS, "time": TIMES, "place": PLACES, "event": EVENTS, "meal": MEALS,
         "grocery": GROCERIES, "item": ITEMS, "store": STORES, "topic": TOPICS, "chore": CHORES, "country": COUNTRIES}


def _pick(rng: random.Random, xs: list[str]) -> str:
    return xs[rng.randrange(len(xs))]


def _money(rng: random.Random) -> str:
    return f"${rng.randrange(3, 240)}.{rng.randrange(100):02d}"


def _fill(rng: random.Random, template: str) -> str:
    """Replace each {slot} in template by a fresh draw, left to right (two {name}s may differ)."""
    def draw(m: re.Match[str]) -> str:
        slot = m.group(1)
        if slot == "money":
            return _money(rng)
        if slot == "n":
            return str(rng.randrange(2, 40))
        return _pick(rng, SLOTS[slot])
    return re.sub(r"\{(\w+)\}", draw, template)


# Things people text each other.
MESSAGES = [
    "fancy {meal} {day}? my treat", "running {n} minutes late, sorry!!", "can you grab {grocery} on your way home?",
    "{event} got moved to {time}", "did you see the photos I sent?", "thanks so much for yesterday, owe you one",
    "can we talk later? it's about {topic}", "I think I left my {item} at your place", "happy birthday!! have a great day",
    "are we still on for {event} {day}?", "the heating is broken again, can you call the landlord?",
    "just landed, see you at {place} in an hour", "any chance you could swap shifts with me {day}?", "don't forget {event} {day} at {time}",
    "my train is delayed, start without me", "want to come to {event} with us {day}?", "is {time} ok for you?",
    "ugh, my phone died, what did you need?", "can I borrow your {item} {day}?", "we're out of {grocery} again",
    "good luck with {event} today!", "I'll be at {place} around {time}", "who's picking up the kids {day}?",
]
# Notifications by app: (app, text).
NOTIFICATIONS = [
    ("Calendar", "{event} {day} at {time}"), ("Calendar", "{event} in 30 minutes at {place}"),
    ("Bank", "{money} spent at {store} with your debit card"), ("Bank", "your salary of {money} has arrived"),
    ("Bank", "low balance: {money} left"), ("Delivery", "your {item} was left with a neighbour"),
    ("Delivery", "your {item} is out for delivery, arriving by {time}"), ("Weather", "heavy rain expected {day} from {time}"),
    ("Weather", "heat warning {day}: stay hydrated"), ("Airline", "flight to {country} is delayed by {n} minutes"),
    ("Airline", "check-in for your flight to {country} is open"), ("Reminders", "{chore}"), ("Fitness", "you walked {n},000 steps today"),
    ("Pharmacy", "your prescription is ready for pickup"), ("School", "{event} {day} at {time}, please confirm"),
    ("Messages", "{name}: {msg}"), ("Messages", "{family}: {msg}"), ("Email", "{name}: question about {topic}"),
    ("Bus", "line {n} is running {n} minutes late"), ("Photos", "you have new memories from {country}"),
]
SUMMARIZE = ["Summarize my notifications in a sentence:", "What do I need to know from these notifications?",
             "Give me a quick overview of my notifications:", "Sum up my notifications briefly:",
             "Which of these notifications need my attention?", "Turn these notifications into a short to-do list:"]
SUMMARIZE_CHAT = ["Sum up this group chat in a sentence:", "What did they decide in this chat?",
                  "TL;DR of this conversation:", "Give me this chat as a couple of bullet points:", "Who is doing what, in short?"]
SUMMARIZE_EMAIL = ["What's this email about, in a sentence?", "What does this email ask me to do?", "Give me the gist of this email:",
                   "Summarize this email for a quick preview:"]
REPLY = ["Give me three quick reply options for this text:", "Say yes to this, in a short reply:", "Help me say no nicely to this:",
         "Write a friendly response to this text:", "How should I answer this message?", "Write a short reply asking for more details:",
         "Draft a one-line reply:"]
REWRITE = ["Can you make this sound nicer?", "Make this more professional:", "Make this message friendlier:",
           "Shorten this message:", "Say this less formally:",
           "Turn this into a polite request:"]
PROOFREAD = ["Fix my grammar:", "Proofread this message:", "Correct the mistakes in this text:",
             "Fix the typos:", "Check this for spelling errors and fix them:"]
# Sentences people ask to rewrite or proofread.
SENTENCES = [
    "I need the {item} back {day}, no excuses.", "I want the {topic} figures on my desk in an hour.",
    "We are not going to {event} because nobody told us the time.", "Tell {name} to call me back about {topic}.",
    "I can't come to {event} {day}, something came up.", "The meeting about {topic} is moved to {time} {day}.",
    "Please remember to {chore} before you leave.", "Your payment of {money} is late and we need it {day}.",
    "Hey, can you maybe look at {topic} when you have time, if it's not too much trouble?",
    "The {item} you sold me stopped working after {n} days.", "We should meet at {place} at {time} to talk about {topic}.",
    "Thank you for the {item}, it was really nice of you.", "{name} and me are going to {place} {day}, you coming?",
]
QUESTIONS = [
    "What currency do they use in {country}?", "What language do people speak in {country}?", "How far is the moon from Earth?",
    "How do I cook rice without it sticking?", "How do I get red wine out of a carpet?", "Why do onions make you cry?",
    "Why do leaves change color in autumn?", "What is a good gift for {family}?", "Give me {n} tips for sleeping better.",
    "How much water should I drink a day?", "What should I pack for a weekend trip to {country}?",
    "Is it safe to eat eggs after the best-before date?", "How is weather different from climate?",
    "How do I politely leave a group chat?", "What can I cook with {grocery} and {grocery}?", "Why is the sea salty?",
    "How do I keep my {item} clean?", "I run {n} km a week. How far is that in a year?",
    "How do I split a {money} bill between {n} people?", "How long does it take to learn to drive?",
    "Explain compound interest in two sentences.", "What time zone is {country} in?",
]
# Python stubs to complete: (signature, docstring).
FUNCTIONS = [
    ("count_vowels(text: str) -> int", "Count the vowels in text."),
    ("celsius_to_fahrenheit(c: float) -> float", "Convert a temperature from Celsius to Fahrenheit."),
    ("unique(items: list) -> list", "Remove duplicates from items, keeping the first occurrence of each."),
    ("chunks(xs: list, n: int) -> list[list]", "Split xs into lists of n items (the last may be shorter)."),
    ("word_counts(text: str) -> dict[str, int]", "Count how often each word appears in text."),
    ("average(numbers: list[float]) -> float", "Return the mean of numbers, or 0.0 for an empty list."),
    ("fizzbuzz(n: int) -> list[str]", "Return the FizzBuzz sequence from 1 to n."),
    ("reverse_words(sentence: str) -> str", "Reverse the order of the words in sentence."),
    ("is_prime(n: int) -> bool", "Check whether n is a prime number."),
    ("merge_dicts(a: dict, b: dict) -> dict", "Merge b into a copy of a; b wins on conflicts."),
    ("flatten(nested: list[list]) -> list", "Flatten a list of lists into one list."),
    ("read_lines(path: str) -> list[str]", "Read a text file and return its non-empty lines, stripped."),
    ("parse_time(s: str) -> tuple[int, int]", "Parse 'HH:MM' into (hours, minutes)."),
    ("total_price(cart: dict[str, float], tax: float) -> float", "Sum the prices in cart and add tax (0.2 = 20%)."),
    ("longest_word(text: str) -> str", "Return the longest word in text."),
]


def notifications(rng: random.Random) -> str:
    """3-6 notifications from different apps, quoted in one line or listed one per line."""
    picks = rng.sample(NOTIFICATIONS, rng.randrange(3, 7))
    lines = [f"{app}: {_fill(rng, text.replace('{msg}', _pick(rng, MESSAGES)))}" for app, text in picks]
    if rng.random() < 0.5:
        return ", ".join(f"'{ln}'" for ln in lines) + "."
    return "\n" + "\n".join(f"- {ln}" for ln in lines)


def group_chat(rng: random.Random) -> str:
    """A short group chat making a plan; no one speaks twice in a row."""
    people = rng.sample(NAMES, rng.randrange(2, 5))
    opening = [f"who's up for {_pick(rng, MEALS)} {_pick(rng, DAYS)}?", f"are we still doing {_pick(rng, EVENTS)}?",
               f"quick question about {_pick(rng, TOPICS)}"]
    middle = ["I'm in", "can't, sorry", "what time?", "{time} works for me", "I can drive", "I'll bring {grocery}",
              "let's meet at {place}", "maybe {day} instead?", "count me in!", "I'll be a bit late", "who's booking?",
              "I'll book it", "same here", "ok see you there"]
    lines, last = [f"{people[0]}: {_pick(rng, opening)}"], people[0]
    for _ in range(rng.randrange(2, 6)):
        last = _pick(rng, [p for p in people if p != last])
        lines.append(f"{last}: {_fill(rng, _pick(rng, middle))}")
    return "\n".join(lines) if rng.random() < 0.6 else " ".join(lines)


def email(rng: random.Random) -> str:
    greet = _pick(rng, ["Morning everyone,", f"Hi {_pick(rng, NAMES)},", "Hello all,", f"Dear {_pick(rng, NAMES)},"])
    body = [_fill(rng, _pick(rng, [
        "{event} now starts at {time} {day} instead.", "we need to wrap up {topic} {day}.",
        "please send me your part of {topic} {day} if you can.", "the printer on the second floor is out of order {day}.",
        "I've attached the notes from {event}.", "{name} will take over {topic} while I'm away.",
        "the budget for {topic} is now {money}.", "can everyone confirm they can make it to {event}?",
        "the room for {event} has changed to {place}.", "thanks for all the work on {topic} this month."]))
        for _ in range(rng.randrange(2, 4))]
    sign = _pick(rng, ["Thanks,", "Best,", "Cheers,", "Kind regards,"]) + " " + _pick(rng, NAMES)
    return " ".join([greet] + [b[0].upper() + b[1:] for b in body] + [sign])


def _quoted(rng: random.Random, ask: str, text: str) -> str:
    if rng.random() < 0.5:
        return f"{ask} '{text}'"
    return f"{ask}\n{text}" if rng.random() < 0.7 else f"{text}\n\n{ask}"


def everyday_request(rng: random.Random) -> str:
    """One request of the on-device kinds (notification, chat and email summaries, replies,
    rewriting, proofreading, short questions, code completion), filled with people, times and
    places."""
    kind = rng.randrange(9)
    if kind == 0:
        return f"{_pick(rng, SUMMARIZE)} {notifications(rng)}"
    if kind == 1:
        return f"{_pick(rng, SUMMARIZE_CHAT)}\n{group_chat(rng)}"
    if kind == 2:
        return _quoted(rng, _pick(rng, SUMMARIZE_EMAIL), email(rng))
    if kind in (3, 4):
        return _quoted(rng, _pick(rng, REPLY), _fill(rng, _pick(rng, MESSAGES)))
    if kind == 5:
        return _quoted(rng, _pick(rng, REWRITE), _fill(rng, _pick(rng, SENTENCES)))
    if kind == 6:
        sentence = _fill(rng, _pick(rng, SENTENCES))
        return _quoted(rng, _pick(rng, PROOFREAD), add_typos(sentence.lower() if rng.random() < 0.3 else sentence, rng, 0.25))
    if kind == 7:
        lead = _pick(rng, ["", "", "Quick question: ", "Hey, ", "Can you tell me: "])
        tail = _pick(rng, ["", "", " Keep it short.", " Answer in one or two sentences.", " Explain it simply."])
        question = _fill(rng, _pick(rng, QUESTIONS))
        return lead + (question[0].lower() + question[1:] if lead else question) + tail
    sig, doc = _pick(rng, FUNCTIONS)
    if rng.random() < 0.4:  # without type hints
        sig = re.sub(r"(\w+): [\w\[\], ]+?(?=[,)])", r"\1", sig.split(" -> ")[0])
    ask = _pick(rng, ["Complete this Python function:", "Finish this code:", "Write the body of this function:",
                      "Fill in this function for me:", "Can you implement this?"])
    body = f'    """{doc}"""' if rng.random() < 0.6 else f"    # {doc[0].lower() + doc[1:]}"
    return f"{ask}\n\n```python\ndef {sig}:\n{body}\n"
