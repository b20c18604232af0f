"""Writes train.json / validation.json in SQuAD v1.1 format from paragraphs and questions we wrote ourselves.

Each answer is given as text; its `answer_start` is computed here (first occurrence in the context) and the
script refuses to write a file when an answer is not a span of its context. Places and people are invented.
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
VALIDATION_TITLES = 6  # the last six articles form the validation split

# (title, context, [(question, answer text), ...])
ARTICLES: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Harbor Lighthouse",
     "The Kelton Point lighthouse was built in 1872 from grey granite quarried on the island itself. Its lamp "
     "was first fuelled by whale oil, then by kerosene, and it was finally electrified in 1931. The last keeper, "
     "Martha Reyes, left the tower in 1968, when an automatic beacon replaced her. Today the building houses a "
     "small museum that opens every summer.",
     [("When was the Kelton Point lighthouse built?", "1872"),
      ("What stone was the lighthouse built from?", "grey granite"),
      ("Who was the last keeper of the lighthouse?", "Martha Reyes"),
      ("When was the lighthouse electrified?", "1931"),
      ("What does the building house today?", "a small museum")]),
    ("Sourdough Bread",
     "Sourdough bread rises because of a starter, a mixture of flour and water in which wild yeast and lactic "
     "acid bacteria live together. The bacteria produce acids that give the bread its tangy flavour, while the "
     "yeast produces carbon dioxide that makes the dough rise. A starter must be fed with fresh flour and water "
     "regularly, usually once a day when kept at room temperature. Many bakers keep the same starter for years.",
     [("What makes sourdough bread rise?", "a starter"),
      ("What gives sourdough its tangy flavour?", "acids"),
      ("What gas does the yeast produce?", "carbon dioxide"),
      ("How often is a starter usually fed at room temperature?", "once a day")]),
    ("Mountain Railway",
     "The Vellmar mountain railway climbs 1,400 metres over a distance of only nine kilometres. To manage the "
     "steep gradient, the line uses a toothed rack between the rails, which a cog wheel under each locomotive "
     "grips. The railway opened in 1899 and was converted from steam to electric traction in 1954. A one-way "
     "trip takes about fifty minutes.",
     [("How many metres does the Vellmar railway climb?", "1,400 metres"),
      ("What lies between the rails to manage the gradient?", "a toothed rack"),
      ("When did the railway open?", "1899"),
      ("How long does a one-way trip take?", "about fifty minutes"),
      ("When was the railway converted to electric traction?", "1954")]),
    ("Honey Bees",
     "A honey bee colony has one queen, a few hundred drones and tens of thousands of workers. Workers are "
     "female and do almost every job in the hive: they clean cells, feed larvae, build wax comb and collect "
     "nectar. A worker bee born in summer lives for about six weeks. Bees tell each other where flowers are by "
     "performing a waggle dance on the comb.",
     [("How many queens does a colony have?", "one"),
      ("What sex are worker bees?", "female"),
      ("How long does a summer worker bee live?", "about six weeks"),
      ("How do bees tell each other where flowers are?", "performing a waggle dance")]),
    ("The Ardent Library",
     "The public library of Ardent was founded in 1907 with a gift of 3,000 books from the merchant Samuel "
     "Okafor. Its reading room, lit by a glass dome, can seat two hundred readers. In 2015 the library added a "
     "makerspace with 3D printers and a recording studio. Membership is free for everyone who lives in the "
     "county.",
     [("When was the public library of Ardent founded?", "1907"),
      ("Who gave the library its first books?", "Samuel Okafor"),
      ("How many books were in the original gift?", "3,000"),
      ("What lights the reading room?", "a glass dome"),
      ("What did the library add in 2015?", "a makerspace")]),
    ("Tea Processing",
     "Green tea and black tea come from the same plant, Camellia sinensis. The difference lies in processing. "
     "For green tea, the leaves are heated soon after picking, which stops oxidation and keeps them green. For "
     "black tea, the leaves are rolled and left to oxidise fully before drying, which turns them dark. Oolong "
     "tea is only partly oxidised.",
     [("Which plant do green and black tea come from?", "Camellia sinensis"),
      ("What stops oxidation in green tea?", "the leaves are heated soon after picking"),
      ("Which tea is only partly oxidised?", "Oolong"),
      ("What happens to the leaves of black tea before drying?", "rolled and left to oxidise fully")]),
    ("River Dam",
     "The Corran dam was completed in 1963 to control floods on the lower Corran river. The concrete wall is 96 "
     "metres high and holds back a reservoir of 310 million cubic metres. Four turbines in the power station at "
     "its foot produce electricity for about 80,000 homes. A fish ladder lets salmon swim upstream past the "
     "wall.",
     [("When was the Corran dam completed?", "1963"),
      ("How high is the concrete wall?", "96 metres"),
      ("How many turbines are in the power station?", "Four"),
      ("How many homes does the dam supply with electricity?", "about 80,000 homes"),
      ("What lets salmon swim past the wall?", "A fish ladder")]),
    ("Volcanic Islands",
     "The Serra islands were formed by volcanoes rising from the ocean floor about two million years ago. The "
     "youngest island, Tamu, still has an active crater that last erupted in 2009. Because the soil is rich in "
     "minerals, farmers on the older islands grow coffee and bananas on the slopes. Black sand beaches line the "
     "northern coasts.",
     [("How were the Serra islands formed?", "by volcanoes rising from the ocean floor"),
      ("Which is the youngest island?", "Tamu"),
      ("When did Tamu's crater last erupt?", "2009"),
      ("What do farmers grow on the slopes?", "coffee and bananas"),
      ("What lines the northern coasts?", "Black sand beaches")]),
    ("Bicycle Gears",
     "A bicycle's gears change how far the bike travels for each turn of the pedals. A large front chainring "
     "combined with a small rear sprocket gives a high gear, which is fast but hard to push. A small chainring "
     "with a large sprocket gives a low gear, which is useful for climbing hills. The derailleur moves the chain "
     "from one sprocket to another.",
     [("What do a bicycle's gears change?", "how far the bike travels for each turn of the pedals"),
      ("Which gear is useful for climbing hills?", "a low gear"),
      ("What moves the chain between sprockets?", "The derailleur"),
      ("What does a large chainring with a small sprocket give?", "a high gear")]),
    ("Community Garden",
     "The Elm Street community garden started in 2011 on an empty lot owned by the city. It now has 48 raised "
     "beds, each rented for twenty dollars a year. Gardeners share tools kept in a blue shed near the gate, and a "
     "rain barrel collects water from its roof. Every September the garden holds a harvest festival with a soup "
     "contest.",
     [("When did the Elm Street community garden start?", "2011"),
      ("How many raised beds does the garden have?", "48"),
      ("How much does a bed cost per year?", "twenty dollars"),
      ("Where are the shared tools kept?", "a blue shed near the gate"),
      ("What event does the garden hold every September?", "a harvest festival")]),
    ("Glass Making",
     "Ordinary window glass is made by melting sand, soda ash and limestone at about 1,500 degrees Celsius. The "
     "molten glass is poured onto a bath of liquid tin, where it spreads out and forms a perfectly flat sheet. "
     "This float process was developed in the 1950s. The sheet is then cooled slowly in a long oven called a "
     "lehr so that it does not crack.",
     [("At what temperature are the ingredients melted?", "about 1,500 degrees Celsius"),
      ("What is the molten glass poured onto?", "a bath of liquid tin"),
      ("When was the float process developed?", "the 1950s"),
      ("What is the long cooling oven called?", "a lehr")]),
    ("Owls",
     "Owls hunt mostly at night. Their large eyes gather a lot of light, but they cannot move them, so an owl "
     "turns its whole head instead, up to 270 degrees. Soft, fringed feathers let owls fly almost silently. The "
     "barn owl can find a mouse in complete darkness using only its hearing.",
     [("When do owls mostly hunt?", "at night"),
      ("How far can an owl turn its head?", "up to 270 degrees"),
      ("What lets owls fly almost silently?", "Soft, fringed feathers"),
      ("Which owl can find a mouse in complete darkness?", "The barn owl")]),
    ("Marathon History",
     "The city marathon of Dorrel was first run in 1978 with only 212 runners. Today more than 30,000 people "
     "take part each April. The course starts at the old stock exchange, crosses three bridges and ends in "
     "Victoria Park. The course record of 2 hours 5 minutes was set in 2019 by Lena Haas.",
     [("When was the Dorrel marathon first run?", "1978"),
      ("How many runners took part in the first race?", "212"),
      ("In which month is the marathon held?", "April"),
      ("Where does the course end?", "Victoria Park"),
      ("Who set the course record?", "Lena Haas")]),
    ("Cheese Cave",
     "In the village of Bressac, cheese has been aged in limestone caves for over four hundred years. The caves "
     "stay at around nine degrees and very high humidity all year, which suits the blue mould that gives the "
     "local cheese its veins. Each wheel is turned by hand once a week. It takes at least three months before a "
     "cheese is ready to sell.",
     [("What kind of caves is cheese aged in at Bressac?", "limestone caves"),
      ("What temperature do the caves stay at?", "around nine degrees"),
      ("How often is each wheel turned?", "once a week"),
      ("How long does it take before a cheese is ready to sell?", "at least three months")]),
    ("Solar Panels",
     "A solar panel is made of many photovoltaic cells, usually cut from thin wafers of silicon. When sunlight "
     "strikes a cell, it knocks electrons loose and creates a direct current. An inverter converts this into "
     "the alternating current used in homes. Most panels sold today convert about twenty percent of the "
     "sunlight that reaches them into electricity.",
     [("What are photovoltaic cells usually cut from?", "thin wafers of silicon"),
      ("What kind of current does a cell create?", "a direct current"),
      ("What converts the current for use in homes?", "An inverter"),
      ("How much of the sunlight do most panels convert?", "about twenty percent")]),
    ("Old Town Clock",
     "The clock on the town hall of Miravel was installed in 1688 by the clockmaker Jan de Wit. It has only an "
     "hour hand, as was common at the time. Twice a day, at noon and at six in the evening, carved figures of a "
     "baker and a soldier come out of small doors and strike the bell. The mechanism is wound by hand every "
     "Sunday.",
     [("When was the clock installed?", "1688"),
      ("Who made the clock?", "Jan de Wit"),
      ("How many hands does the clock have?", "only an hour hand"),
      ("Which carved figures strike the bell?", "a baker and a soldier"),
      ("When is the mechanism wound?", "every Sunday")]),
    ("Coral Reefs",
     "Coral reefs are built by tiny animals called polyps, which produce hard skeletons of calcium carbonate. "
     "Algae living inside the polyps make food from sunlight and give the coral its colour. When the water "
     "becomes too warm, the polyps expel the algae and turn white, a process known as bleaching. Reefs cover "
     "less than one percent of the ocean floor but shelter about a quarter of all marine species.",
     [("What animals build coral reefs?", "polyps"),
      ("What are the polyps' skeletons made of?", "calcium carbonate"),
      ("What is it called when polyps expel the algae?", "bleaching"),
      ("What share of marine species do reefs shelter?", "about a quarter")]),
    ("Paper Recycling",
     "Used paper is mixed with water in a large tank called a pulper, which breaks it into fibres. Ink is "
     "removed by blowing air through the mixture so that ink particles stick to bubbles and float to the top. "
     "The cleaned fibres are then pressed and dried into new sheets. Each time paper is recycled its fibres get "
     "shorter, so they can be reused only five to seven times.",
     [("What is the tank that breaks paper into fibres called?", "a pulper"),
      ("How is ink removed?", "by blowing air through the mixture"),
      ("What happens to the fibres each time paper is recycled?", "its fibres get shorter"),
      ("How many times can fibres be reused?", "five to seven times")]),
    ("Night Market",
     "The Lanfeng night market opens at six every evening in a car park that is empty after the office day. "
     "About 120 stalls sell grilled squid, bubble tea, second-hand books and phone cases. The market began in "
     "1994 with eleven food carts. On Saturdays a local band plays on a small stage near the east entrance.",
     [("When does the Lanfeng night market open?", "at six every evening"),
      ("How many stalls are at the market?", "About 120"),
      ("When did the market begin?", "1994"),
      ("How many food carts did it begin with?", "eleven"),
      ("Where does the band play?", "on a small stage near the east entrance")]),
    ("Wool Production",
     "Sheep are usually shorn once a year, in late spring, before the summer heat. A skilled shearer can remove "
     "a fleece in under two minutes. The raw wool is washed to remove lanolin, a natural grease that is later "
     "used in skin creams. After washing, the fibres are combed in a process called carding and spun into yarn.",
     [("How often are sheep usually shorn?", "once a year"),
      ("How long does a skilled shearer need to remove a fleece?", "under two minutes"),
      ("What grease is washed out of raw wool?", "lanolin"),
      ("What is the combing process called?", "carding")]),
    ("Space Telescope",
     "The fictional Aurora space telescope was launched in 2031 and orbits the Sun about 1.5 million kilometres "
     "from Earth. Its main mirror is 6 metres across and is made of eighteen hexagonal segments. Aurora observes "
     "infrared light, so it must be kept extremely cold behind a sunshield the size of a tennis court.",
     [("When was the Aurora telescope launched?", "2031"),
      ("How far from Earth does Aurora orbit?", "about 1.5 million kilometres"),
      ("How many segments make up the main mirror?", "eighteen"),
      ("What kind of light does Aurora observe?", "infrared light"),
      ("How big is the sunshield?", "the size of a tennis court")]),
    ("Rice Terraces",
     "On the hills of the Kanlo valley, farmers have cut rice terraces into the slopes for about a thousand "
     "years. Water from mountain springs flows from the highest terrace down to the lowest through bamboo "
     "channels. Each family repairs the stone walls of its terraces after the rainy season. Planting is done by "
     "hand in May.",
     [("How long have farmers cut terraces in the Kanlo valley?", "about a thousand years"),
      ("Where does the water come from?", "mountain springs"),
      ("What carries water between terraces?", "bamboo channels"),
      ("When is planting done?", "in May")]),
    ("Fire Station",
     "The fire station on Harbour Road was rebuilt in 2004 after the old wooden building became too small for "
     "modern engines. It has three bays, a training tower five storeys high and a kitchen where the crews cook "
     "together. Eighteen full-time firefighters work there in four shifts. The station answers about 1,100 calls "
     "a year.",
     [("When was the fire station rebuilt?", "2004"),
      ("How high is the training tower?", "five storeys"),
      ("How many full-time firefighters work there?", "Eighteen"),
      ("How many calls does the station answer a year?", "about 1,100")]),
    ("Chocolate",
     "Chocolate is made from the seeds of the cacao tree, which grows only in warm, wet regions near the "
     "equator. After harvest, the seeds are fermented for about a week and then dried in the sun. Roasting "
     "brings out their flavour. The roasted nibs are ground into a paste called chocolate liquor, which contains "
     "no alcohol despite its name.",
     [("What is chocolate made from?", "the seeds of the cacao tree"),
      ("How long are the seeds fermented?", "about a week"),
      ("What brings out the flavour of the seeds?", "Roasting"),
      ("What is the paste of ground nibs called?", "chocolate liquor")]),
    ("Tidal Island",
     "Morrow Island can be reached on foot only at low tide, along a stone causeway 800 metres long. Twice a day "
     "the sea covers the causeway completely. A small monastery was built on the island in the twelfth century, "
     "and its chapel is still used for weddings. Tide tables are posted at both ends of the path.",
     [("When can Morrow Island be reached on foot?", "only at low tide"),
      ("How long is the causeway?", "800 metres"),
      ("When was the monastery built?", "the twelfth century"),
      ("What is the chapel still used for?", "weddings"),
      ("Where are tide tables posted?", "at both ends of the path")]),
    ("Typewriters",
     "Early typewriters placed the letters in alphabetical order, but fast typists jammed the metal type bars. "
     "The QWERTY layout, introduced in the 1870s, separated common pairs of letters to reduce jams. Electric "
     "typewriters became common in offices in the 1950s. A typewriter ribbon is a strip of inked fabric that the "
     "type strikes against the paper.",
     [("How were the letters placed on early typewriters?", "in alphabetical order"),
      ("When was the QWERTY layout introduced?", "the 1870s"),
      ("Why did QWERTY separate common pairs of letters?", "to reduce jams"),
      ("What is a typewriter ribbon?", "a strip of inked fabric")]),
    # --- validation articles (the last six) ---
    ("Wind Farm",
     "The Gorran wind farm stands on a ridge twelve kilometres from the coast. Its 34 turbines each have three "
     "blades 60 metres long. The turbines turn to face the wind automatically and stop when wind speeds exceed "
     "90 kilometres per hour. Sheep still graze between the towers.",
     [("Where does the Gorran wind farm stand?", "on a ridge twelve kilometres from the coast"),
      ("How many turbines does the farm have?", "34"),
      ("How long are the blades?", "60 metres"),
      ("When do the turbines stop?", "when wind speeds exceed 90 kilometres per hour"),
      ("What animals graze between the towers?", "Sheep")]),
    ("Postal Service",
     "The postal service of Valdor delivers letters six days a week. Sorting is done at a central office in the "
     "capital, where machines read handwritten addresses with cameras. Rural letters are carried by van, and "
     "three islands are served by a boat that sails every morning. A standard stamp costs ninety cents.",
     [("How many days a week are letters delivered?", "six days a week"),
      ("Where is sorting done?", "at a central office in the capital"),
      ("How do machines read handwritten addresses?", "with cameras"),
      ("How are the islands served?", "by a boat"),
      ("How much does a standard stamp cost?", "ninety cents")]),
    ("Maple Syrup",
     "Maple syrup is made from the sap of sugar maple trees, collected in early spring when nights are freezing "
     "and days are mild. The sap is mostly water, so it is boiled for hours to concentrate the sugar. About forty "
     "litres of sap are needed to make one litre of syrup. The syrup is graded by its colour.",
     [("What trees is maple syrup made from?", "sugar maple trees"),
      ("When is the sap collected?", "early spring"),
      ("Why is the sap boiled?", "to concentrate the sugar"),
      ("How much sap makes one litre of syrup?", "About forty litres"),
      ("How is the syrup graded?", "by its colour")]),
    ("Suspension Bridge",
     "The Halden suspension bridge crosses the fjord with a main span of 1,100 metres. Its deck hangs from two "
     "steel cables, each made of more than 20,000 wires. The towers are 180 metres tall. The bridge opened in "
     "2002 and replaced a ferry that had run for sixty years.",
     [("How long is the main span of the Halden bridge?", "1,100 metres"),
      ("What does the deck hang from?", "two steel cables"),
      ("How tall are the towers?", "180 metres"),
      ("When did the bridge open?", "2002"),
      ("What did the bridge replace?", "a ferry")]),
    ("Hedgehogs",
     "Hedgehogs are small mammals covered in about five thousand spines. When threatened, a hedgehog rolls into a "
     "tight ball. They eat beetles, worms and caterpillars, which makes them welcome in gardens. In cold "
     "climates hedgehogs hibernate from November until March.",
     [("How many spines cover a hedgehog?", "about five thousand"),
      ("What does a hedgehog do when threatened?", "rolls into a tight ball"),
      ("What do hedgehogs eat?", "beetles, worms and caterpillars"),
      ("When do hedgehogs hibernate?", "from November until March")]),
    ("Printing Press",
     "The printing workshop of Elias Brandt opened in the port of Lemberg in 1521. It used movable metal type "
     "and a wooden screw press adapted from wine making. In its first year the workshop printed a psalter and a "
     "calendar. Brandt trained twelve apprentices, several of whom founded workshops of their own.",
     [("Who owned the printing workshop?", "Elias Brandt"),
      ("When did the workshop open?", "1521"),
      ("What was the screw press adapted from?", "wine making"),
      ("How many apprentices did Brandt train?", "twelve")]),
]


def to_squad(articles: list[tuple[str, str, list[tuple[str, str]]]], prefix: str) -> dict[str, object]:
    data = []
    n = 0
    for title, context, qas in articles:
        entries = []
        for question, answer in qas:
            start = context.find(answer)
            if start < 0:
                raise ValueError(f"answer {answer!r} is not a span of the context of {title!r}")
            assert context[start:start + len(answer)] == answer
            entries.append({"id": f"{prefix}-{n:04d}", "question": question,
                            "answers": [{"text": answer, "answer_start": start}]})
            n += 1
        data.append({"title": title, "paragraphs": [{"context": context, "qas": entries}]})
    return {"version": "1.1", "data": data}


def main() -> None:
    train = to_squad(ARTICLES[:-VALIDATION_TITLES], "tr")
    validation = to_squad(ARTICLES[-VALIDATION_TITLES:], "va")
    for name, doc in (("train.json", train), ("validation.json", validation)):
        (HERE / name).write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    count = sum(len(a[2]) for a in ARTICLES)
    print(f"wrote {len(ARTICLES)} contexts, {count} questions to {HERE}")


if __name__ == "__main__":
    main()
