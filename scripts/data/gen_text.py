"""Chat and instruction-following prompts: templated everyday requests, requests
over real paragraphs and definitions (from sources.py), and the self-instruct
stage (few-shot frames the target completes with new questions and requests).
"""

from __future__ import annotations

import random
import re

# Topics for templated requests and for self-instruct.
TOPICS = [
    "cooking", "baking bread", "gardening", "houseplants", "personal finance", "saving money", "budgeting",
    "learning a language", "dogs", "cats", "birds", "time management", "the solar system", "astronomy",
    "photography", "job interviews", "writing a resume", "healthy sleep", "running", "cycling", "swimming",
    "yoga", "nutrition", "vegetarian food", "coffee", "tea", "wine", "camping", "hiking", "travel in Japan",
    "travel in Italy", "road trips", "airports", "public speaking", "negotiation", "leadership",
    "remote work", "meetings", "email etiquette", "friendship", "parenting", "toddlers", "teenagers",
    "weddings", "birthdays", "moving to a new city", "renting an apartment", "buying a car",
    "car maintenance", "electric cars", "bicycles repair", "home repair", "painting a room", "plumbing",
    "woodworking", "knitting", "sewing", "drawing", "watercolor painting", "music theory", "learning guitar",
    "piano practice", "singing", "film history", "classic novels", "poetry", "writing fiction",
    "journaling", "meditation", "stress", "motivation", "habits", "productivity apps", "smartphones",
    "laptops", "passwords and online safety", "social media", "email scams", "backups", "spreadsheets",
    "presentations", "statistics", "probability", "geometry", "algebra", "calculus", "physics", "chemistry",
    "biology", "the human body", "the immune system", "the brain", "genetics", "evolution", "dinosaurs",
    "oceans", "volcanoes", "earthquakes", "weather", "climate change", "renewable energy", "recycling",
    "composting", "forests", "rivers", "deserts", "the Arctic", "ancient Egypt", "ancient Rome",
    "ancient Greece", "the Middle Ages", "the Renaissance", "the Industrial Revolution", "World War II",
    "the Cold War", "space exploration", "the Moon landing", "inventions", "famous scientists",
    "philosophy", "ethics", "logic puzzles", "chess", "board games", "video games", "soccer", "basketball",
    "tennis", "the Olympics", "marathons", "first aid", "colds and flu", "dentists", "eye health",
    "allergies", "economics", "inflation", "the stock market", "taxes", "small business", "marketing",
    "customer service", "job satisfaction", "career change", "university applications", "studying for exams",
    "homework help", "teaching children to read", "languages of the world", "grammar", "punctuation",
    "vocabulary", "idioms", "translation", "letters and cards", "gift ideas", "holidays", "cleaning",
    "laundry", "organizing a closet", "minimalism", "interior design", "furniture", "architecture",
    "bridges", "trains", "airplanes", "ships", "maps", "geography quizzes", "capital cities", "flags",
    "museums", "theater", "dance", "fashion", "skin care", "hair care", "fitness at home", "stretching",
    "posture", "walking", "pets and travel", "aquariums", "horses", "insects", "bees", "spiders",
    "sharks", "whales", "mushrooms", "fruit trees", "pizza", "pasta", "soups", "salads", "desserts",
    "breakfast ideas", "meal planning", "food safety", "kitchen tools", "restaurants", "tipping",
    "manners", "apologies", "conflict at work", "neighbors", "volunteering", "charity", "elections",
    "how laws are made", "human rights", "the internet", "how computers work", "artificial intelligence",
    "robots", "3D printing", "electricity", "batteries", "light and color", "sound", "magnets", "time zones",
    "calendars", "clocks", "numbers in everyday life", "recipes for kids", "picnics", "festivals",
]

EVERYDAY_GOALS = [
    "make a good first impression at a new job", "keep houseplants alive in winter", "fall asleep faster",
    "start running as a beginner", "write a thank-you card", "organize my weekly schedule",
    "stop procrastinating", "prepare for a job interview", "learn to cook simple meals",
    "make my phone battery last longer", "choose a good password", "save money on groceries",
    "clean a cast iron pan", "remove a coffee stain from a shirt", "plan a birthday party for a child",
    "introduce a new cat to my dog", "study for a math exam", "give constructive feedback",
    "stay motivated while learning a language", "pack a suitcase efficiently", "reduce screen time",
    "ask for a raise", "make friends in a new city", "care for a sourdough starter",
    "speak more confidently in meetings", "set up a simple home workout", "keep a journal",
    "teach a child to ride a bike", "prepare for a long flight", "choose a laptop for university",
    "write a short speech for a wedding", "back up photos from my phone", "deal with a noisy neighbor",
    "brew good coffee at home", "start a vegetable garden on a balcony", "memorize a short poem",
]

PAIRS = [
    ("a virus", "a bacterium"), ("a hurricane", "a tornado"), ("a crocodile", "an alligator"),
    ("baking soda", "baking powder"), ("a simile", "a metaphor"), ("speed", "velocity"),
    ("a lake", "a pond"), ("an ape", "a monkey"), ("a debit card", "a credit card"),
    ("mass", "weight"), ("a democracy", "a republic"), ("a comet", "an asteroid"),
    ("latitude", "longitude"), ("a fruit", "a vegetable"), ("renting", "buying a home"),
    ("a CV", "a cover letter"), ("affect", "effect"), ("a sweet potato", "a yam"),
    ("an email", "a letter"), ("RAM", "storage"), ("Wi-Fi", "Bluetooth"), ("a star", "a planet"),
    ("an herbivore", "a carnivore"), ("stocks", "bonds"), ("a violin", "a viola"),
]

INSTRUCT_TEMPLATES = [
    "Write a short poem about {topic}.", "Write a limerick about {topic}.",
    "Give me five tips about {topic}.", "Write a short story opening about {topic}.",
    "Explain {topic} to a ten-year-old.", "Write three quiz questions about {topic}, with answers.",
    "Make a checklist for someone getting started with {topic}.", "Write a catchy headline about {topic}.",
    "Write a two-paragraph blog post introduction about {topic}.",
    "List common mistakes beginners make with {topic}.", "Write a short dialogue between two friends about {topic}.",
    "Create a one-week plan for learning about {topic}.", "Write a tweet-length fun fact about {topic}.",
    "Describe {topic} in exactly three sentences.", "Write an outline for a short talk on {topic}.",
]

CHAT_TEMPLATES = [
    "How do I {goal}?", "What's the best way to {goal}?", "Can you help me {goal}?",
    "I want to {goal}. Where should I start?", "Any advice on how to {goal}?",
]

PARAGRAPH_REQUESTS = [
    "Summarize the following text in one or two sentences:\n\n{p}",
    "Rewrite this paragraph in simpler words:\n\n{p}",
    "List the key points of this text as bullet points:\n\n{p}",
    "Suggest a short title for this text:\n\n{p}",
    "Write three questions a reader might ask after reading this:\n\n{p}",
    "Explain this paragraph to someone who is new to the topic:\n\n{p}",
    "Extract the most important technical terms from this text and define each one briefly:\n\n{p}",
    "Rewrite the following text as a short, friendly message:\n\n{p}",
    "What is the main idea of this paragraph?\n\n{p}",
]

QUOTE_REQUESTS = [
    "What does this quote mean?\n\n\"{q}\"", "Explain the idea behind this saying: \"{q}\"",
    "Do you agree with this statement? Explain briefly.\n\n\"{q}\"",
    "Write a short story inspired by this line: \"{q}\"",
]

# Self-instruct: few-shot frames completed by the target (raw text, no chat
# template). The examples are fixed, hand-written and not taken from the
# evaluation prompts; the target continues the list for a new topic.
SELF_INSTRUCT_FRAMES = {
    "question": (
        "Below are questions that people asked a helpful assistant, grouped by topic.\n\n"
        "Topic: cooking\n- How long should I boil an egg to get a soft yolk?\n"
        "- What can I use instead of butter when baking cookies?\n- Why does my bread come out dense?\n\n"
        "Topic: travel\n- What should I pack for a week in a rainy city?\n"
        "- How can I reduce jet lag after a long flight?\n- Is it cheaper to book hotels early or late?\n\n"
        "Topic: {topic}\n-"),
    "instruction": (
        "Below are tasks that people gave a helpful assistant, grouped by topic.\n\n"
        "Topic: email\n- Write a short email asking my manager for a day off next Monday.\n"
        "- Make this message sound more polite: send me the report now.\n"
        "- Summarize the main points of a long email in three bullet points.\n\n"
        "Topic: history\n- Explain the causes of the French Revolution in simple terms.\n"
        "- Write a timeline of the main events of the Apollo 11 mission.\n"
        "- Compare the Roman Republic and the Roman Empire in a short table.\n\n"
        "Topic: {topic}\n-"),
}

# A third set of frames (`meta --frames v3`): the task types common in
# instruction data that the first frames' examples rarely lead the target to
# write (work on a given text, lists, short verse, translation, for and
# against), and chat requests that are not questions.
SELF_INSTRUCT_FRAMES_V3 = {
    "request": (
        "Below are messages that people sent to a friendly assistant in a chat, grouped by topic.\n\n"
        "Topic: moving house\n- Can you help me plan the week before a move?\n"
        "- Why do boxes always seem to run out on the last day?\n"
        "- Give me a few ideas for meeting people in a new town.\n\n"
        "Topic: coffee\n- Tell me how a French press works.\n"
        "- I drink four cups a day, is that too much?\n"
        "- Suggest three simple ways to make iced coffee at home.\n\n"
        "Topic: {topic}\n-"),
    "task": (
        "Below are short tasks that people gave a helpful assistant, grouped by topic. "
        "Some include the text to work on.\n\n"
        "Topic: office work\n- Make this note friendlier: the printer is broken again, do not touch it.\n"
        "- Put these points into one sentence: budget approved, starts in May, two new hires.\n"
        "- Write a limerick about a stapler that keeps jamming.\n"
        "- Give three reasons for and three against an open-plan office.\n\n"
        "Topic: animals\n- Name four animals that live in the desert and how each finds water.\n"
        "- Translate 'the dog is sleeping under the table' into German.\n"
        "- Sort these animals by size: horse, mouse, elephant, fox.\n"
        "- Write a riddle whose answer is an owl.\n\n"
        "Topic: {topic}\n-"),
}

# What each frame's items become.
FRAME_KIND = {"question": "chat", "instruction": "instruct", "request": "chat", "task": "instruct"}
FRAME_SETS = {"v1": SELF_INSTRUCT_FRAMES, "v3": SELF_INSTRUCT_FRAMES_V3}


def templated_instruct(r: random.Random, count: int) -> list[tuple[str, str]]:
    return [("template", r.choice(INSTRUCT_TEMPLATES).format(topic=r.choice(TOPICS))) for _ in range(count)]


def templated_chat(r: random.Random) -> list[tuple[str, str]]:
    out = [("advice", r.choice(CHAT_TEMPLATES).format(goal=g)) for g in EVERYDAY_GOALS]
    for a, b in PAIRS:
        out.append(("compare", r.choice([f"What is the difference between {a} and {b}?",
                                         f"How can I tell {a} from {b}?"])))
    return out


def paragraph_requests(r: random.Random, pars: list[tuple[str, str]], count: int) -> list[tuple[str, str, str]]:
    """(topic, prompt, origin) requests over (origin, paragraph) pairs."""
    return [("paragraph", r.choice(PARAGRAPH_REQUESTS).format(p=p), origin)
            for origin, p in r.sample(pars, min(count, len(pars)))]


def quote_requests(r: random.Random, quotes: list[tuple[str, str]], count: int) -> list[tuple[str, str, str]]:
    out = []
    for origin, q in r.sample(quotes, min(count, len(quotes))):
        q = re.sub(r"\s*\n\s*", " ", q.strip())
        out.append(("quote", r.choice(QUOTE_REQUESTS).format(q=q), origin))
    return out


def term_requests(r: random.Random, terms: list[tuple[str, str]], count: int, flavor: str,
               with_definition: float) -> list[tuple[str, str, str]]:
    """Questions about dictionary headwords; a fraction quote the definition
    and ask for a rewrite."""
    out = []
    for head, definition in r.sample(terms, min(count, len(terms))):
        if r.random() < with_definition and 80 <= len(definition) <= 600:
            out.append(("definition", r.choice([
                f"Rewrite this definition of \"{head}\" in plain English for a beginner:\n\n{definition}",
                f"Here is a dictionary entry for \"{head}\":\n\n{definition}\n\nSummarize it in one sentence.",
                f"Give an everyday example that illustrates this definition of \"{head}\":\n\n{definition}",
            ]), head))
        elif flavor == "computing":
            out.append(("term", r.choice([f"What does the computing term \"{head}\" mean?",
                                          f"Explain \"{head}\" in computing, with an example.",
                                          f"What is {head}?"]), head))
        else:
            out.append(("term", r.choice([f"In hacker slang, what does \"{head}\" mean?",
                                          f"Where does the jargon term \"{head}\" come from, and how is it used?"]),
                        head))
    return out


def self_instruct_meta(repeats: int, frames: str = "v1") -> list[dict]:
    """The meta-prompts of the self-instruct stage: every (frame, topic) pair
    of the frame set `frames` (v1, v3), `repeats` times (each repeat samples
    with its own seed)."""
    out = []
    for rep in range(repeats):
        for frame, text in FRAME_SETS[frames].items():
            for i, topic in enumerate(TOPICS):
                out.append({"id": f"meta-{frame}-{i:03d}-{rep}", "kind": frame,
                            "prompt": text.format(topic=topic)})
    return out


_BAD = re.compile(r"topic:|assistant|\bAI\b|as an ai|language model|helpful|below are|\[|\]|\{|\}|http|"
                  r"@|#|\*|\bquestion(s)?\b.*\bask|^\d", re.I)


def parse_self_instruct(response: str) -> list[str]:
    """Items of a completed list: the first line continues the frame's "-";
    later lines must start with "- "; stops at the first other line."""
    items = []
    for k, line in enumerate(response.split("\n")):
        line = line.strip()
        if k > 0:
            if not line.startswith("- "):
                break
            line = line[2:]
        line = line.strip().strip('"').strip()
        if not (15 <= len(line) <= 200) or _BAD.search(line):
            continue
        if not line[0].isupper() or line[-1] not in "?.!" or not line.isascii():
            continue
        if len(line.split()) < 4:
            continue
        items.append(line)
    return items
