"""The demo corpus: a small English text, written for folio, that trains the demo tokenizer and model.

It is plain data plus a seeded generator, so every build sees the same text. Three kinds of
documents: short stories and descriptions (hand-written), simple facts drawn from tables (so a
tiny model can learn a pattern such as "The capital of France is Paris."), and chat exchanges
that teach the ChatML turn structure. A few non-ASCII words (café, Zürich, 東京, emoji) give the
byte-level tokenizer tokens that hold only part of a UTF-8 character.
"""

from __future__ import annotations

import random

STORIES = [
    """Once upon a time there was a small town by the sea. Every morning the fishermen went out in their boats, and every evening they came back with baskets full of fish. The children ran down to the harbour to meet them, and the old women sat by the doors and told stories about storms and ships and lights that moved under the water.""",
    """Once upon a time a young fox lived at the edge of a great forest. He was clever, but he was also lazy. One day he saw a crow sitting in a tree with a piece of cheese in her beak. "Good morning," said the fox. "What a beautiful bird you are. I am sure your voice is even more beautiful than your feathers." The crow was pleased, and she opened her beak to sing. The cheese fell to the ground, and the fox ran away with it. The crow learned that kind words are not always kind.""",
    """Once upon a time there was a girl named Anna who wanted to see the mountains. Her father told her that the road was long and the nights were cold. Anna packed bread, cheese, a warm coat and a small book, and she walked for three days. On the fourth morning she saw the white tops of the mountains shining in the sun, and she knew that the long walk had been worth it.""",
    """The old lighthouse stood on a rock at the end of the bay. For a hundred years its light had turned every night, and for a hundred years the ships had found their way home. The keeper was a quiet man who liked books and tea. He wrote down the weather in a thick notebook: the wind, the rain, the fog, and the colour of the sky at sunset.""",
    """In the spring the fields turn green and the trees are full of flowers. In the summer the days are long and warm, and people swim in the rivers and the lakes. In the autumn the leaves turn red and yellow and fall to the ground. In the winter the nights are long, the air is cold, and sometimes the whole world is white with snow.""",
    """A good loaf of bread needs only four things: flour, water, salt and time. Mix the flour and the water, add the salt and a little yeast, and let the dough rest. Fold it a few times, let it rise again, and bake it in a hot oven until the crust is brown. The smell of fresh bread fills the whole house.""",
    """The river begins as a small stream high in the hills. It runs over stones and under bridges, through forests and past farms. Other streams join it, and it grows wider and slower. At last it reaches the sea, where the fresh water meets the salt water and the birds wait for fish.""",
    """A computer is a machine that follows instructions. It reads numbers from its memory, adds and multiplies them, and writes the results back. A program is a long list of such instructions. Even a simple program can do many useful things: it can count words, sort names, draw pictures or answer questions.""",
    """A language model reads text one token at a time and tries to guess the next token. A token can be a whole word, a part of a word, or a single letter. When the model has seen a great deal of text, its guesses become good enough to write sentences, answer questions and tell stories. This small model has read only a few pages, so its stories are short and a little strange.""",
    """Folio is an engine that runs language models. It keeps the memory of each conversation in small blocks, so that many people can talk to the model at the same time. When a new request arrives, folio adds it to the running batch at the next step instead of waiting for the others to finish.""",
    """The cat sat on the warm window and watched the rain. Drops ran down the glass in little rivers. Outside, a dog walked past with its owner, both of them wet and both of them happy. The cat closed its eyes. It did not like the rain, but it liked to watch it from a dry place.""",
    """My grandmother kept a garden behind her house. She grew tomatoes, beans, potatoes and tall yellow flowers that followed the sun. Every summer she gave baskets of vegetables to the neighbours, and every winter she planned the next garden on the back of old letters.""",
    """The train left the station at seven in the morning. It was full of people going to work, students with heavy bags, and a family going to the sea. A man read a newspaper, a woman looked out of the window, and a small boy counted the bridges. By nine the city was far behind them.""",
    """We met at a small café in Zürich, near the lake. The coffee was strong and the cake was sweet. Later we flew to 東京, where the streets were bright at night and the trains were always on time. It was a long journey, but a happy one 🙂""",
    """The library was the quietest place in the town. Its shelves held books about history, science, music and the stars. Students came to read in the afternoon, and old men came to read the newspapers in the morning. The librarian knew every book and where to find it.""",
    """At night the sky over the desert is full of stars. The moon rises slowly, large and orange, and then it becomes small and white. The sand is cold after the heat of the day. Far away a wind begins, and the dunes move a little, as they have moved for thousands of years.""",
]

CAPITALS = [
    ("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Germany", "Berlin"),
    ("Portugal", "Lisbon"), ("Japan", "Tokyo"), ("China", "Beijing"), ("India", "New Delhi"),
    ("Egypt", "Cairo"), ("Kenya", "Nairobi"), ("Brazil", "Brasilia"), ("Argentina", "Buenos Aires"),
    ("Canada", "Ottawa"), ("Mexico", "Mexico City"), ("Peru", "Lima"), ("Chile", "Santiago"),
    ("Greece", "Athens"), ("Norway", "Oslo"), ("Sweden", "Stockholm"), ("Finland", "Helsinki"),
    ("Poland", "Warsaw"), ("Austria", "Vienna"), ("Ireland", "Dublin"), ("Russia", "Moscow"),
    ("Turkey", "Ankara"), ("Australia", "Canberra"), ("England", "London"), ("Denmark", "Copenhagen"),
    ("the United States", "Washington"), ("South Korea", "Seoul"),
]
NAMES = ["Anna", "Tom", "Maria", "David", "Sofia", "James", "Lena", "Omar", "Emma", "Lucas",
         "Mia", "Paul", "Clara", "Sam", "Nora", "Ben", "Alice", "Leo", "Eva", "Max"]
JOBS = ["teacher", "doctor", "baker", "farmer", "writer", "painter", "nurse", "engineer",
        "student", "musician", "cook", "pilot"]
LIKES = ["books", "music", "long walks", "the sea", "good bread", "old films", "the mountains",
         "cooking", "gardens", "trains", "the rain", "chess", "café au lait", "crème brûlée"]
# Homes beyond the capitals, for non-ASCII text in the introductions.
TOWNS = ["Zürich", "Kraków", "São Paulo", "Málaga", "Genève", "東京", "北京", "Reykjavík"]
NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
                "ten", "eleven", "twelve"]

GREETINGS = [
    ("Hello!", "Hello! 🙂 How can I help you today?"),
    ("Hi there.", "Hi! What would you like to talk about?"),
    ("Good morning!", "Good morning! I hope you have a wonderful day."),
    ("How are you?", "I am fine, thank you. How are you?"),
    ("Who are you?", "I am a small demo model running on folio. I know only a few pages of text."),
    ("What can you do?", "I can tell short stories and answer simple questions about capitals and numbers."),
    ("Thank you!", "You are welcome! 🙂"),
    ("Goodbye.", "Goodbye! Have a nice day."),
    ("Tell me a story.", "Once upon a time there was a small town by the sea."),
    ("Tell me about the seasons.", "In the spring the fields turn green, and in the winter the nights are long."),
    ("How do I bake bread?", "Mix flour, water, salt and a little yeast, let the dough rise, and bake it in a hot oven."),
    ("What is a language model?", "A language model reads text one token at a time and tries to guess the next token."),
]


def pretraining_documents(seed: int = 0) -> list[str]:
    """Plain-text documents: the stories, then fact and introduction paragraphs."""
    rng = random.Random(seed)
    docs = list(STORIES)
    docs += [_capital_paragraph(rng) for _ in range(24)]
    docs += [_introduction(rng) for _ in range(40)]
    docs += [_arithmetic_paragraph(rng) for _ in range(8)]
    return docs


def chat_conversations(seed: int = 0) -> list[list[dict[str, str]]]:
    """Short user/assistant exchanges, some with a system message."""
    rng = random.Random(seed + 1)
    conversations = [[_user(q), _assistant(a)] for q, a in GREETINGS]
    for country, city in CAPITALS:
        conversations.append(
            [_user(f"What is the capital of {country}?"), _assistant(f"The capital of {country} is {city}.")]
        )
    for _ in range(12):
        a, b = rng.randrange(7), rng.randrange(6)
        question = f"What is {NUMBER_WORDS[a]} plus {NUMBER_WORDS[b]}?"
        answer = f"{NUMBER_WORDS[a].capitalize()} plus {NUMBER_WORDS[b]} is {NUMBER_WORDS[a + b]}."
        conversations.append([_user(question), _assistant(answer)])
    for _ in range(8):
        name = rng.choice(NAMES)
        conversations.append(
            [
                {"role": "system", "content": "You are a helpful assistant."},
                _user(f"Hello, my name is {name}."),
                _assistant(f"Hello, {name}! It is nice to meet you. How can I help?"),
            ]
        )
    rng.shuffle(conversations)
    return conversations


def tokenizer_training_text(seed: int = 0) -> list[str]:
    """Everything the model will read, as plain text (no special tokens) for BPE training."""
    texts = pretraining_documents(seed)
    for conversation in chat_conversations(seed):
        texts.append("\n".join(f"{m['role']}\n{m['content']}" for m in conversation))
    return texts


def _user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def _assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def _capital_paragraph(rng: random.Random) -> str:
    picks = rng.sample(CAPITALS, 4)
    sentences = []
    for country, city in picks:
        form = rng.randrange(3)
        if form == 0:
            sentences.append(f"The capital of {country} is {city}.")
        elif form == 1:
            sentences.append(f"{city} is the capital of {country}.")
        else:
            sentences.append(f"The capital of {country} is {city}, a city of old streets and busy markets.")
    return " ".join(sentences)


def _introduction(rng: random.Random) -> str:
    name, job, like = rng.choice(NAMES), rng.choice(JOBS), rng.choice(LIKES)
    city = rng.choice(TOWNS + [city for _, city in CAPITALS])
    article = "an" if job[0] in "aeiou" else "a"
    return (
        f"Hello, my name is {name}. I live in {city} and I work as {article} {job}. "
        f"In my free time I like {like}."
    )


def _arithmetic_paragraph(rng: random.Random) -> str:
    sentences = []
    for _ in range(4):
        a, b = rng.randrange(7), rng.randrange(6)
        sentences.append(f"{NUMBER_WORDS[a].capitalize()} plus {NUMBER_WORDS[b]} is {NUMBER_WORDS[a + b]}.")
    return " ".join(sentences)
