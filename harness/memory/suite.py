"""BEAM-style long-history suites: synthetic, coherent multi-session phone-assistant histories with
planted facts, updates, contradictions, preferences, instructions and dated events, and questions with
exact answers over BEAM's ten abilities.

Deterministic from (seed, size): the same arguments write the same bytes. Every answer and every piece of
evidence comes from the generator's own state (the plants it placed), never from reading the text back.
The persona (user, contacts, city, clock) is the sandbox's (`envs.world.build_persona`); fillers use the
sandbox's value pools (restaurants, songs, products, ...), so the history talks about the same world the
benchmark's tools act on.

Layout of a suite directory:
  history.jsonl    one turn per line: {"id", "session", "ts", "role", "content"} (ids from 1, time order)
  questions.jsonl  {"id", "ability", "question", "answer", "answer_kind", "evidence": [turn ids],
                    "key_points": [...], "paraphrased": bool, "reader": {hints for the scripted reader only}}
  meta.json        {"tokens", "target_tokens", "turns", "sessions", "seed", "persona_seed", "user", "now", ...}
Tokens are estimated as ceil(chars / 4) over each turn's content.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import math
import os
import random
from typing import Any, Callable, Iterator

from mpa_jax.envs.catalog import CITIES, FIRST, LAST, POOLS
from mpa_jax.envs.world import build_persona, stable_hash
from mpa_jax.harness.memory.store import estimate_tokens

ABILITIES: tuple[str, ...] = (
    "abstention", "contradiction_resolution", "event_ordering", "information_extraction",
    "instruction_following", "knowledge_update", "multi_session_reasoning", "preference_following",
    "summarization", "temporal_reasoning",
)
SIZES: dict[str, int] = {"100k": 100_000, "500k": 500_000, "1m": 1_000_000, "10m": 10_000_000}


def parse_size(text: str) -> int:
    """'100k' | '1m' | '250000' -> tokens; ValueError naming the text otherwise."""
    t = str(text).strip().lower()
    if t in SIZES:
        return SIZES[t]
    mult = {"k": 1_000, "m": 1_000_000}.get(t[-1:], 1)
    num = t[:-1] if mult != 1 else t
    try:
        n = int(float(num) * mult)
    except ValueError:
        raise ValueError(f"--tokens must be like 100k, 500k, 1m, 10m or a number, got {text!r}") from None
    if n < 2_000:
        raise ValueError(f"--tokens must be at least 2000, got {text!r}")
    return n


# ----------------------------------------------------------------------------------------- names

_ONSET = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "st", "tr", "gl", "sk")
_VOWEL = ("a", "e", "i", "o", "u", "ai", "ou", "ei")
_CODA = ("", "", "n", "r", "l", "s", "m", "th", "nd")


class Names:
    """Unique made-up proper names (never an English word or a pool value), so a planted subject is findable
    only through what the history says about it, and abstention questions can name things never said."""

    def __init__(self, rng: random.Random, banned: set[str]) -> None:
        self.rng = rng
        self.used = set(banned)

    def __call__(self) -> str:
        for _ in range(10_000):
            n = "".join(self.rng.choice(_ONSET) + self.rng.choice(_VOWEL) + self.rng.choice(_CODA)
                        for _ in range(self.rng.choice((2, 2, 3))))
            if 5 <= len(n) <= 11 and n not in self.used:
                self.used.add(n)
                return n.capitalize()
        raise RuntimeError("ran out of made-up names")


# ----------------------------------------------------------------------------------------- plants


@dataclasses.dataclass
class Plant:
    """Planted turns of one question: (position in [0, 1), user text, assistant text); positions ascend."""

    ability: str
    turns: list[tuple[float, str, str]]
    question: str
    answer: Any
    answer_kind: str  # exact | number | order | keypoints | must_mention | conflict | abstain
    evidence: list[int]  # indices into `turns` whose user turn is the evidence
    key_points: list[str] = dataclasses.field(default_factory=list)
    reader: dict[str, Any] = dataclasses.field(default_factory=dict)
    mention: str = ""  # how other turns refer to the subject (distractors)
    paraphrased: bool = False  # the question avoids the words the history used


def _positions(rng: random.Random, k: int, gap: float) -> list[float]:
    """k ascending positions in [0.02, 0.98) at least `gap` apart."""
    span = 0.96 - gap * (k - 1)
    base = sorted(rng.uniform(0, span) for _ in range(k))
    return [0.02 + b + i * gap for i, b in enumerate(base)]


_OK = ("Got it, I'll remember that.", "Noted.", "Okay, saved that for later.", "Thanks, I'll keep that in mind.")

_EXTRACT = (  # (subject template, value maker)
    ("the locker code at {N} Gym", lambda r: f"{r.randint(1000, 9999)}"),
    ("the gate code for the {N} building", lambda r: f"{r.randint(100, 999)}{r.choice('ABCDEFGH')}"),
    ("the wifi password at the {N} cabin", lambda r: f"{r.choice(('maple', 'river', 'stone', 'cedar', 'amber'))}{r.randint(10, 99)}"),
    ("my membership number at {N} Library", lambda r: f"LIB-{r.randint(10000, 99999)}"),
    ("the booking reference for the {N} ferry", lambda r: f"{''.join(r.choice('KQXZRTW') for _ in range(3))}{r.randint(100, 999)}"),
    ("the parking spot at {N} Plaza", lambda r: f"level {r.randint(1, 6)} spot {r.randint(10, 250)}"),
)
_ROLES = ("dentist", "coach", "tutor", "landlord", "plumber", "babysitter", "accountant", "vet", "hairdresser",
          "physiotherapist", "piano teacher", "mechanic", "electrician", "dog walker", "therapist", "optician",
          "financial advisor", "personal trainer", "gardener", "lawyer", "doctor", "pharmacist", "nanny", "driving instructor")
_CONTRA = (
    ("I've never been to {N}.", "Back when I visited {N}, the old harbour was my favourite spot.", "Have I ever been to {N}?"),
    ("I have never tried {N} stew.", "I had {N} stew again last night and loved it.", "Have I ever eaten {N} stew?"),
    ("I've never met {N} in person.", "I had coffee with {N} again this morning.", "Have I ever met {N} in person?"),
    ("I have never owned a car from {N} Motors.", "My old {N} Motors hatchback finally needs new tyres.", "Have I ever owned a {N} Motors car?"),
)
_OCCASIONS = ("wedding", "birthday party", "housewarming", "retirement dinner", "baby shower", "graduation party")
_STEPS = ("booked the venue", "sent the invitations", "ordered the cake", "hired a photographer",
          "bought the decorations", "chose the music", "arranged the transport", "printed the seating plan")
_TOPICS = ("flights", "the weather", "restaurants", "my calendar", "workouts", "my bank balance", "train times",
           "movie times", "hotels", "podcasts", "recipes", "the news", "traffic", "parking", "rides", "packages",
           "groceries", "concerts", "museums", "my sleep")
_DIRECTIVES = (("give prices in euros", "euros"), ("answer in Spanish", "Spanish"), ("use 24-hour time", "24-hour"),
               ("show distances in kilometers", "kilometers"), ("start with a one-line summary", "summary"),
               ("mention the source", "source"), ("list at most three options", "three"),
               ("add a reminder suggestion", "reminder"))
_PREFS = (  # (activity, options)
    ("dinner out", ("vegetarian places", "spicy food", "quiet places", "outdoor seating")),
    ("weekend hikes", ("short loops", "lake trails", "shaded trails", "dog-friendly trails")),
    ("movie nights", ("documentaries", "comedies", "thrillers", "animated films")),
    ("coffee", ("oat milk flat whites", "black filter coffee", "decaf", "iced lattes")),
    ("hotel stays", ("rooms on a high floor", "hotels with a gym", "quiet rooms", "places with breakfast")),
    ("flight seats", ("window seats", "aisle seats", "exit rows", "seats near the front")),
    ("podcasts on my commute", ("history shows", "science shows", "short episodes", "interview shows")),
    ("gifts for my sister", ("books", "plants", "board games", "concert tickets")),
    ("workouts", ("morning sessions", "swimming", "short intervals", "yoga")),
    ("weekend trips", ("train travel", "small towns", "beach towns", "mountain huts")),
    ("lunch orders", ("salads", "noodle bowls", "sandwiches", "soups")),
    ("music while working", ("jazz", "lo-fi beats", "classical", "ambient")),
)
_COUNTS = (
    ("I bought a new plant for the {N} balcony garden: a {x}.", ("fern", "cactus", "basil", "orchid", "ivy", "aloe", "mint"),
     "How many plants have I bought for the {N} balcony garden?", "plant for the {N} balcony garden"),
    ("Added a book to the {N} reading list: {x}.", ("Dune", "Emma", "Ulysses", "Beloved", "Rebecca", "Persuasion"),
     "How many books have I added to the {N} reading list?", "to the {N} reading list"),
    ("I paid {x} dollars toward the {N} trip fund.", tuple(str(v) for v in (20, 35, 40, 50, 60, 75, 80, 120)),
     "How much have I paid toward the {N} trip fund in total, in dollars?", "toward the {N} trip fund"),
)
_POINTS = (  # key point templates for summarization; {v} is the checkable value
    ("the budget is {v} dollars", lambda r, n: str(r.randrange(1000, 9000, 50))),
    ("the deadline is {v}", lambda r, n: f"{r.choice(('May', 'June', 'July', 'August'))} {r.randint(2, 28)}"),
    ("{v} leads the design", lambda r, n: n()),
    ("we picked {v} as the vendor", lambda r, n: n() + " Supplies"),
    ("the kickoff meeting is in {v}", lambda r, n: r.choice(CITIES)),
    ("the team has {v} people", lambda r, n: str(r.randint(3, 12))),
)
_SPANS = (("I started the {N} pottery course today.", "I finished the {N} pottery course today.",
           "How many days did the {N} pottery course take, from the day I started to the day I finished?"),
          ("We started renovating the {N} kitchen today.", "The {N} kitchen renovation is done as of today.",
           "How many days did the {N} kitchen renovation take?"),
          ("I began reading the {N} saga today.", "I finished the {N} saga today.",
           "How many days did it take me to read the {N} saga?"))


_DISTRACT = {  # mentions of a plant's subject that carry no evidence (they compete for the context budget)
    "information_extraction": ("I might stop by {e} later this week.", "Is {e} open on Sundays?", "{e} was busy today."),
    "knowledge_update": ("Remind me to ask my {e} about next month.", "I still owe my {e} a call.", "Did my {e} send the invoice?"),
    "contradiction_resolution": ("{e} came up in conversation today.", "Someone mentioned {e} at lunch."),
    "event_ordering": ("For {e}: I still need to think about the flowers.", "Everyone keeps asking me about {e}."),
    "instruction_following": ("Check {e} for me.", "Anything new about {e}?"),
    "preference_following": ("I was thinking about {e} again.", "My sister asked me about {e}."),
    "multi_session_reasoning": ("I looked at {e} again today.", "{E} needs some attention this weekend."),
    "summarization": ("I have a call about {e} tomorrow.", "Remind me to follow up on {e}."),
    "temporal_reasoning": ("The {e} is going well so far.", "Told a friend about the {e}."),
}


# Paraphrased questions: the same question without the words the history used (BEAM's questions are
# written by people, not copied from the chat). A lexical index cannot bridge these; they show what it misses.
_ROLE_PARA = {
    "dentist": "Who looks after my teeth now?", "coach": "Who is training me these days?",
    "tutor": "Who gives me private lessons now?", "landlord": "Who am I renting my flat from now?",
    "plumber": "Who do I call now when a pipe leaks?", "babysitter": "Who watches the kids for me now?",
    "accountant": "Who does my taxes now?", "vet": "Who treats my pets now?", "hairdresser": "Who cuts my hair now?",
    "physiotherapist": "Who is treating my back injury now?", "piano teacher": "Who gives me music lessons now?",
    "mechanic": "Who repairs my car now?", "electrician": "Who handles the wiring at my place now?",
    "dog walker": "Who takes my pup out now?", "therapist": "Who do I see for counselling now?",
    "optician": "Who checks my eyes now?", "financial advisor": "Who manages my investments now?",
    "personal trainer": "Who runs my gym sessions now?", "gardener": "Who looks after my garden now?",
    "lawyer": "Who handles my legal matters now?", "doctor": "Who do I see when I'm ill now?",
    "pharmacist": "Who fills my prescriptions now?", "nanny": "Who looks after the children now?",
    "driving instructor": "Who is teaching me to drive now?",
}
_TOPIC_PARA = {
    "flights": "air travel", "the weather": "the forecast", "restaurants": "places to eat", "my calendar": "my schedule",
    "workouts": "exercise", "my bank balance": "how much money I have", "train times": "rail departures",
    "movie times": "film showings", "hotels": "places to stay", "podcasts": "audio shows", "recipes": "cooking ideas",
    "the news": "current events", "traffic": "congestion on the roads", "parking": "where to leave the car",
    "rides": "getting a taxi", "packages": "deliveries", "groceries": "food shopping", "concerts": "live music",
    "museums": "exhibitions", "my sleep": "how I rested",
}
_ACTIVITY_PARA = {
    "dinner out": "eating at a restaurant tonight", "weekend hikes": "a walk in the hills",
    "movie nights": "something to watch at home", "coffee": "my morning caffeine",
    "hotel stays": "where to sleep on my trip", "flight seats": "where to sit on the plane",
    "podcasts on my commute": "something to listen to on the way to work", "gifts for my sister": "a present for my sibling",
    "workouts": "getting some exercise", "weekend trips": "a short getaway",
    "lunch orders": "what to get for my midday meal", "music while working": "background sounds at my desk",
}


def distractors_per_plant(tokens: int) -> int:
    """Subject mentions without evidence per planted question: more as the history grows (2 at 100K, 6 at 10M)."""
    return max(1, round(2 * math.log10(max(tokens, 10_000) / 10_000)))


def _plants(rng: random.Random, name: Callable[[], str], per: int, tokens: int, paraphrase: float = 0.0) -> list[Plant]:
    out: list[Plant] = []

    def para() -> bool:
        return rng.random() < paraphrase

    for i in range(per):  # information extraction
        subj_t, val = _EXTRACT[i % len(_EXTRACT)]
        subj, v = subj_t.format(N=name()), val(rng)
        text = rng.choice(("By the way, {s} is {v}.", "Note for later: {s} is {v}.", "Just so you know, {s} is {v}."))
        out.append(Plant("information_extraction", [(rng.uniform(0.02, 0.98), text.format(s=subj, v=v), rng.choice(_OK))],
                         f"What is {subj}?", v, "exact", [0], reader={"subject": subj},
                         mention=subj.split(" at ")[-1].split(" for ")[-1]))
    roles = rng.sample(_ROLES, min(per, len(_ROLES)))
    for role in roles:  # knowledge update: 1-2 updates, the newest wins
        people = [f"{name()} {rng.choice(LAST)}" for _ in range(rng.choice((2, 3)))]
        pos = _positions(rng, len(people), 0.08)
        turns = [(pos[0], f"My {role} is {people[0]}.", rng.choice(_OK))]
        for p, (old, new) in zip(pos[1:], zip(people, people[1:])):
            turns.append((p, f"Quick update: my {role} is now {new}, I switched from {old}.", "Updated, thanks."))
        pq = para()
        out.append(Plant("knowledge_update", turns, _ROLE_PARA[role] if pq else f"Who is my {role} now?", people[-1],
                         "exact", [len(turns) - 1], reader={"subject": f"my {role}"}, mention=role, paraphrased=pq))
    for i in range(per):  # contradiction: a denial and a later affirmation, no update cue
        neg, pos_t, q = _CONTRA[i % len(_CONTRA)]
        n = name()
        p = _positions(rng, 2, 0.1)
        if rng.random() < 0.5:
            p = p[::-1]
        turns = sorted([(p[0], neg.format(N=n), "Okay."), (p[1], pos_t.format(N=n), "Sounds nice.")])
        out.append(Plant("contradiction_resolution", turns, q.format(N=n), "conflicting", "conflict", [0, 1],
                         reader={"subject": n}, mention=n))
    for i in range(per):  # event ordering
        who = f"{name()}'s {rng.choice(_OCCASIONS)}"
        steps = rng.sample(_STEPS, 4)
        pos = _positions(rng, 4, 0.05)
        turns = [(p, f"For {who}: I {s} today.", "Great progress.") for p, s in zip(pos, steps)]
        shown = steps[:]
        rng.shuffle(shown)
        out.append(Plant("event_ordering", turns, f"In what order did I do these things for {who}: {', '.join(shown)}?",
                         steps, "order", [0, 1, 2, 3], reader={"subject": who, "options": shown}, mention=who))
    for topic in rng.sample(_TOPICS, min(per, len(_TOPICS))):  # instruction following
        directive, keyword = rng.choice(_DIRECTIVES)
        text = f"From now on, whenever I ask about {topic}, {directive}."
        pq = para()
        out.append(Plant("instruction_following", [(rng.uniform(0.02, 0.9), text, "Understood, I will.")],
                         f"Can you give me an update on {_TOPIC_PARA[topic] if pq else topic}?", keyword, "must_mention", [0],
                         paraphrased=pq,
                         reader={"subject": topic, "directive": directive}, mention=topic))
    for activity, options in rng.sample(_PREFS, min(per, len(_PREFS))):  # preference following
        opt = rng.choice(options)
        text = rng.choice(("When it comes to {a}, I prefer {o}.", "For {a} I really prefer {o}."))
        pq = para()
        out.append(Plant("preference_following", [(rng.uniform(0.02, 0.9), text.format(a=activity, o=opt), "Good to know.")],
                         f"Any suggestions for {_ACTIVITY_PARA[activity] if pq else activity} this weekend?", opt,
                         "must_mention", [0], paraphrased=pq,
                         reader={"subject": activity, "preference": opt}, mention=activity))
    for i in range(per):  # multi-session: count or sum over several sessions
        tmpl, items, q, subj = _COUNTS[i % len(_COUNTS)]
        n = name()
        k = rng.randint(2, 5)
        xs = rng.sample(items, k)
        pos = _positions(rng, k, 0.04)
        turns = [(p, tmpl.format(N=n, x=x), "Nice.") for p, x in zip(pos, xs)]
        ans = sum(int(x) for x in xs) if "dollars" in tmpl else k
        out.append(Plant("multi_session_reasoning", turns, q.format(N=n), ans, "number", list(range(k)),
                         reader={"subject": subj.format(N=n), "sum": "dollars" in tmpl},
                         mention=subj.format(N=n).split(" the ", 1)[-1].join(("the ", ""))))
    for i in range(per):  # summarization: key points of one project spread over sessions
        proj = f"the {name()} project"
        pts = rng.sample(_POINTS, rng.randint(3, 5))
        vals = [mk(rng, name) for _, mk in pts]
        pos = _positions(rng, len(pts), 0.04)
        turns = [(p, f"About {proj}: {t.format(v=v)}.", "Noted.") for p, (t, _), v in zip(pos, pts, vals)]
        out.append(Plant("summarization", turns, f"Summarize what I told you about {proj}.", vals, "keypoints",
                         list(range(len(turns))), key_points=vals, reader={"subject": proj}, mention=proj))
    for i in range(per):  # temporal: days between two dated turns (the session dates)
        start_t, end_t, q = _SPANS[i % len(_SPANS)]
        n = name()
        pos = _positions(rng, 2, 0.05)
        turns = [(pos[0], start_t.format(N=n), "Exciting!"), (pos[1], end_t.format(N=n), "Congratulations!")]
        thing = start_t.format(N=n).split(" the ", 1)[-1].rstrip(".").replace(" today", "")
        out.append(Plant("temporal_reasoning", turns, q.format(N=n), None, "number", [0, 1], reader={"subject": n},
                         mention=thing))
    for i in range(per):  # abstention: the same shapes of question about things never said
        n = name()
        q = rng.choice((f"What is the locker code at {n} Gym?", f"Have I ever been to {n}?",
                        f"How many plants have I bought for the {n} balcony garden?",
                        f"Summarize what I told you about the {n} project.", f"Who is {n}'s dentist?"))
        out.append(Plant("abstention", [], q, "unknown", "abstain", [], reader={"subject": n}))
    k = distractors_per_plant(tokens)
    for p in out:
        if p.ability == "abstention":
            continue
        for _ in range(k):
            t = rng.choice(_DISTRACT[p.ability]).format(e=p.mention, E=p.mention[:1].upper() + p.mention[1:])
            t = t[:1].upper() + t[1:]
            p.turns.append((rng.uniform(0.02, 0.98), t, rng.choice(("Okay.", "Sure.", "Noted."))))
    return out


# ----------------------------------------------------------------------------------------- filler


def _filler(rng: random.Random, persona: Any, rows: dict[str, list[dict[str, Any]]]) -> tuple[str, str]:
    """One ordinary exchange about the persona's world (contacts, places, music, errands)."""
    c = rng.choice(rows["contact"])["name"]
    first = c.split()[0]
    P = POOLS
    k = rng.randrange(22)
    day = rng.choice(("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"))
    time_ = f"{rng.randint(7, 21)}:{rng.choice(('00', '15', '30', '45'))}"
    if k == 0:
        return (f"Can you text {c} that I'm running about {rng.randint(5, 25)} minutes late?",
                f"Sent to {c}: \"Running about that late, see you soon.\"")
    if k == 1:
        return (f"What's the weather looking like in {rng.choice(CITIES)} on {day}?",
                f"Mostly {rng.choice(('sunny', 'cloudy', 'rainy', 'windy'))} with a high of {rng.randint(8, 31)} degrees.")
    if k == 2:
        return (f"Play {rng.choice(P['song'])} by {rng.choice(P['artist'])}.", "Playing it now.")
    if k == 3:
        return (f"Add {rng.choice(P['product']).lower()} to my shopping list.", "Added to your shopping list.")
    if k == 4:
        return (f"Remind me to {rng.choice(P['reminder_title']).lower()} on {day}.", f"Reminder set for {day} morning.")
    if k == 5:
        return (f"Book a table for {rng.randint(2, 6)} at {rng.choice(P['restaurant'])} at {time_}.",
                f"I found a table at {time_}; shall I confirm it?")
    if k == 6:
        return (f"How long does it take to get to {rng.choice(P['poi'])} by {rng.choice(('car', 'bus', 'bike', 'train'))}?",
                f"About {rng.randint(8, 55)} minutes right now.")
    if k == 7:
        return (f"Set an alarm for {time_} tomorrow.", f"Alarm set for {time_}.")
    if k == 8:
        return (f"Did {first} email me back about the {rng.choice(P['event_title']).lower()}?",
                f"Not yet; the last message from {first} was {rng.randint(2, 9)} days ago.")
    if k == 9:
        return (f"Log a {rng.randint(15, 70)} minute {rng.choice(P['workout_kind'])} workout.", "Logged it.")
    if k == 10:
        return (f"What's on my calendar for {day}?",
                f"You have {rng.choice(P['event_title']).lower()} at {time_} and nothing after that.")
    if k == 11:
        return (f"Order the {rng.choice(P['dish']).lower()} from {rng.choice(P['restaurant'])} again.",
                "Your usual order is placed; it should arrive in about 35 minutes.")
    if k == 12:
        return (f"Call {c}.", f"Calling {c}.")
    if k == 13:
        return (f"Any good {rng.choice(P['cuisine'])} places near {rng.choice(P['poi'])}?",
                f"{rng.choice(P['restaurant'])} has good reviews and is a short walk away.")
    if k == 14:
        return (f"How much did I spend on {rng.choice(P['txn_category']).lower()} this month?",
                f"About {rng.randint(40, 600)} dollars so far.")
    if k == 15:
        return (f"Find flights from {persona.home_city} to {rng.choice(CITIES)} next {day}.",
                f"The cheapest is {rng.choice(P['airline'])} at {rng.randint(90, 700)} dollars, leaving at {time_}.")
    if k == 16:
        return (f"Start a {rng.randint(3, 30)} minute timer for the {rng.choice(P['timer_label']).lower()}.", "Timer started.")
    if k == 17:
        return (f"Turn on {rng.choice(('do not disturb', 'dark mode', 'bluetooth', 'low power mode', 'wifi'))}.", "Done.")
    if k == 18:
        return (f"Take a note: {rng.choice(P['note_text'])}", "Saved the note.")
    if k == 19:
        return (f"Remind me what {first} does for work.", f"{first} works at {rng.choice(P['company'])}.")
    if k == 20:
        return (f"Is the {rng.choice(P['podcast'])} episode out yet?", "Yes, a new episode came out this morning.")
    return (f"Convert {rng.randint(2, 90)} {rng.choice(('miles', 'pounds', 'cups', 'feet'))} for me.",
            "Here is the conversion.")


# ----------------------------------------------------------------------------------------- writer


def span_days(tokens: int) -> int:
    """How many days the history covers: grows with its length (about 60 days at 100K, 600 at 10M)."""
    return max(20, int(60 * (tokens / 100_000) ** 0.5))


def write_suite(out_dir: str, tokens: int, *, seed: int = 0, per_ability: int = 10, persona_seed: int = 0,
                paraphrase: float = 0.3, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Write a suite of about `tokens` history tokens to `out_dir`; returns its meta."""
    if not 0.0 <= paraphrase <= 1.0:
        raise ValueError(f"paraphrase must be in [0, 1], got {paraphrase}")
    rng = random.Random(stable_hash("memory-suite", seed, tokens, per_ability, persona_seed, paraphrase))
    persona, rows = build_persona(persona_seed)
    banned = {w.lower() for pool in POOLS.values() for v in pool for w in str(v).split()}
    banned |= {w.lower() for w in FIRST + LAST + list(CITIES)}
    plants = _plants(rng, Names(random.Random(rng.random()), banned), per_ability, tokens, paraphrase)
    # Plant schedule: (position, plant index, turn index), time order.
    schedule = sorted((pos, pi, ti) for pi, p in enumerate(plants) for ti, (pos, _, _) in enumerate(p.turns))
    start = dt.datetime.fromisoformat(persona.now) - dt.timedelta(days=span_days(tokens))
    days = span_days(tokens)
    os.makedirs(out_dir, exist_ok=True)
    turn_ids: dict[tuple[int, int], int] = {}
    turn_ts: dict[tuple[int, int], str] = {}
    used = 0
    tid = 0
    session = 0
    nxt = 0
    last_ts = start
    with open(os.path.join(out_dir, "history.jsonl"), "w", encoding="utf-8") as f:
        while used < tokens:
            session += 1
            frac = used / tokens
            ts = max(start + dt.timedelta(days=frac * days), last_ts + dt.timedelta(minutes=30))
            pairs: list[tuple[str, str, tuple[int, int] | None]] = [(*_filler(rng, persona, rows), None)
                                                                    for _ in range(rng.randint(3, 8))]
            while nxt < len(schedule) and schedule[nxt][0] <= frac:  # plants due now join this session
                _, pi, ti = schedule[nxt]
                _, u, a = plants[pi].turns[ti]
                pairs.insert(rng.randint(0, len(pairs)), (u, a, (pi, ti)))
                nxt += 1
            for u, a, key in pairs:
                for role, text in (("user", u), ("assistant", a)):
                    tid += 1
                    stamp = ts.strftime("%Y-%m-%dT%H:%M")
                    f.write(json.dumps({"id": tid, "session": session, "ts": stamp, "role": role, "content": text},
                                       ensure_ascii=False) + "\n")
                    used += estimate_tokens(text)
                    if key is not None and role == "user":
                        turn_ids[key], turn_ts[key] = tid, stamp
                    ts += dt.timedelta(minutes=1)
            last_ts = ts
            if progress is not None and session % 200 == 0:
                progress(min(used, tokens), tokens)
        # Plants not yet placed (positions near the end of a short history) close the history.
        tail = schedule[nxt:]
        session += 1 if tail else 0
        ts = last_ts + dt.timedelta(minutes=30)
        for _, pi, ti in tail:
            _, u, a = plants[pi].turns[ti]
            for role, text in (("user", u), ("assistant", a)):
                tid += 1
                stamp = ts.strftime("%Y-%m-%dT%H:%M")
                f.write(json.dumps({"id": tid, "session": session, "ts": stamp, "role": role, "content": text},
                                   ensure_ascii=False) + "\n")
                used += estimate_tokens(text)
                if role == "user":
                    turn_ids[(pi, ti)], turn_ts[(pi, ti)] = tid, stamp
                ts += dt.timedelta(minutes=1)
    with open(os.path.join(out_dir, "questions.jsonl"), "w", encoding="utf-8") as f:
        for qi, p in enumerate(plants):
            answer = p.answer
            if p.ability == "temporal_reasoning":  # from the session dates the generator gave the two turns
                d0, d1 = (dt.date.fromisoformat(turn_ts[(qi, i)][:10]) for i in (0, 1))
                answer = (d1 - d0).days
            q = {"id": f"q{qi:04d}", "ability": p.ability, "question": p.question, "answer": answer,
                 "answer_kind": p.answer_kind, "evidence": [turn_ids[(qi, i)] for i in p.evidence],
                 "key_points": p.key_points, "paraphrased": p.paraphrased, "reader": p.reader}
            f.write(json.dumps(q, ensure_ascii=False) + "\n")
    meta = {"tokens": used, "target_tokens": tokens, "turns": tid, "sessions": session, "seed": seed,
            "per_ability": per_ability, "persona_seed": persona_seed, "paraphrase": paraphrase, "user": persona.user_name,
            "now": persona.now, "questions": len(plants), "token_estimate": "ceil(chars/4) per turn"}
    with open(os.path.join(out_dir, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, sort_keys=True)
    return meta


def read_history(suite_dir: str) -> Iterator[dict[str, Any]]:
    """The suite's turns in order."""
    with open(os.path.join(suite_dir, "history.jsonl"), encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)


def read_questions(suite_dir: str) -> list[dict[str, Any]]:
    with open(os.path.join(suite_dir, "questions.jsonl"), encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def read_meta(suite_dir: str) -> dict[str, Any]:
    with open(os.path.join(suite_dir, "meta.json"), encoding="utf-8") as f:
        return json.load(f)
