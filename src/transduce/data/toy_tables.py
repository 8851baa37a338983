"""The toy language pair's word tables and German morphology, as data (:mod:`.toy_grammar` reads
them, :mod:`.toy` samples from them)."""

# ---- lexicon ---------------------------------------------------------------------------------
# nouns: en_sg en_pl de_sg de_pl gender tags
NOUNS = """
man men Mann Männer m animate
woman women Frau Frauen f animate
child children Kind Kinder n animate
dog dogs Hund Hunde m animate
cat cats Katze Katzen f animate
teacher teachers Lehrer Lehrer m animate
girl girls Mädchen Mädchen n animate
friend friends Freund Freunde m animate
doctor doctors Arzt Ärzte m animate
king kings König Könige m animate
queen queens Königin Königinnen f animate
bird birds Vogel Vögel m animate
horse horses Pferd Pferde n animate
mouse mice Maus Mäuse f animate
sister sisters Schwester Schwestern f animate
brother brothers Bruder Brüder m animate
cook cooks Koch Köche m animate
mother mothers Mutter Mütter f animate
father fathers Vater Väter m animate
cow cows Kuh Kühe f animate
uncle uncles Onkel Onkel m animate
aunt aunts Tante Tanten f animate
book books Buch Bücher n thing,read
letter letters Brief Briefe m thing,read
newspaper newspapers Zeitung Zeitungen f thing,read
apple apples Apfel Äpfel m thing,food
cake cakes Kuchen Kuchen m thing,food
egg eggs Ei Eier n thing,food
banana bananas Banane Bananen f thing,food
ball balls Ball Bälle m thing
car cars Auto Autos n thing
table tables Tisch Tische m thing
chair chairs Stuhl Stühle m thing
bag bags Tasche Taschen f thing
cup cups Tasse Tassen f thing
flower flowers Blume Blumen f thing
key keys Schlüssel Schlüssel m thing
hat hats Hut Hüte m thing
picture pictures Bild Bilder n thing
bike bikes Fahrrad Fahrräder n thing
door doors Tür Türen f thing
window windows Fenster Fenster n thing
glass glasses Glas Gläser n thing
shoe shoes Schuh Schuhe m thing
coat coats Mantel Mäntel m thing
lamp lamps Lampe Lampen f thing
bottle bottles Flasche Flaschen f thing
box boxes Kiste Kisten f thing
clock clocks Uhr Uhren f thing
park parks Park Parks m place
garden gardens Garten Gärten m place
city cities Stadt Städte f place
school schools Schule Schulen f place
kitchen kitchens Küche Küchen f place
forest forests Wald Wälder m place
street streets Straße Straßen f place
station stations Bahnhof Bahnhöfe m place
market markets Markt Märkte m place
village villages Dorf Dörfer n place
house houses Haus Häuser n place
room rooms Zimmer Zimmer n place
church churches Kirche Kirchen f place
bridge bridges Brücke Brücken f place
tree trees Baum Bäume m place
"""

# verbs: en en_3sg en_participle de_inf de_1sg de_3sg de_participle aux frame object_tags
# frames: intr, acc (accusative object), dat (dative object), ditr (dative + accusative),
# clause (a dass-clause). Each English verb has exactly one frame, so parses are unique.
VERBS = """
sleep sleeps slept schlafen schlafe schläft geschlafen haben intr -
run runs run laufen laufe läuft gelaufen sein intr -
laugh laughs laughed lachen lache lacht gelacht haben intr -
swim swims swum schwimmen schwimme schwimmt geschwommen sein intr -
wait waits waited warten warte wartet gewartet haben intr -
come comes come kommen komme kommt gekommen sein intr -
sing sings sung singen singe singt gesungen haben intr -
dance dances danced tanzen tanze tanzt getanzt haben intr -
play plays played spielen spiele spielt gespielt haben intr -
work works worked arbeiten arbeite arbeitet gearbeitet haben intr -
cry cries cried weinen weine weint geweint haben intr -
go goes gone gehen gehe geht gegangen sein intr -
jump jumps jumped springen springe springt gesprungen sein intr -
see sees seen sehen sehe sieht gesehen haben acc animate,thing,place
find finds found finden finde findet gefunden haben acc animate,thing
like likes liked mögen mag mag gemocht haben acc animate,thing,place
love loves loved lieben liebe liebt geliebt haben acc animate
visit visits visited besuchen besuche besucht besucht haben acc animate,place
read reads read lesen lese liest gelesen haben acc read
buy buys bought kaufen kaufe kauft gekauft haben acc thing
carry carries carried tragen trage trägt getragen haben acc thing,animate
need needs needed brauchen brauche braucht gebraucht haben acc thing
eat eats eaten essen esse isst gegessen haben acc food
open opens opened öffnen öffne öffnet geöffnet haben acc thing
wash washes washed waschen wasche wäscht gewaschen haben acc thing,animate
paint paints painted malen male malt gemalt haben acc thing,animate,place
take takes taken nehmen nehme nimmt genommen haben acc thing
hear hears heard hören höre hört gehört haben acc animate
have has had haben habe hat gehabt haben acc thing,animate
help helps helped helfen helfe hilft geholfen haben dat animate
thank thanks thanked danken danke dankt gedankt haben dat animate
follow follows followed folgen folge folgt gefolgt sein dat animate
answer answers answered antworten antworte antwortet geantwortet haben dat animate
give gives given geben gebe gibt gegeben haben ditr thing
show shows shown zeigen zeige zeigt gezeigt haben ditr thing
bring brings brought bringen bringe bringt gebracht haben ditr thing
send sends sent schicken schicke schickt geschickt haben ditr thing
say says said sagen sage sagt gesagt haben clause -
think thinks thought denken denke denkt gedacht haben clause -
know knows known wissen weiß weiß gewusst haben clause -
believe believes believed glauben glaube glaubt geglaubt haben clause -
"""

ADJECTIVES = """
big groß|small klein|old alt|young jung|new neu|red rot|blue blau|green grün|good gut
beautiful schön|tired müde|happy glücklich|fast schnell|black schwarz|white weiß
hungry hungrig|funny lustig|yellow gelb|cold kalt|heavy schwer|clever klug
friendly freundlich|brown braun|long lang|short kurz|loud laut|sad traurig
"""

TIME_ADVERBS = """
today|heute
now|jetzt
often|oft
sometimes|manchmal
tomorrow|morgen
in the morning|am Morgen
in the evening|am Abend
at night|in der Nacht
on Sunday|am Sonntag
every day|jeden Tag
perhaps|vielleicht
unfortunately|leider
"""

MANNER_ADVERBS = """
quickly|schnell
slowly|langsam
quietly|leise
loudly|laut
happily|fröhlich
carefully|vorsichtig
together|zusammen
alone|allein
"""

CONJUNCTIONS = """
because|weil
although|obwohl
if|wenn
while|während
before|bevor
after|nachdem
"""

# prepositions: en|de|case|object tags|contractions of the definite article
PREPOSITIONS = """
in|in|dat|place|dem=im
near|bei|dat|place,animate|dem=beim
to|zu|dat|place,animate|dem=zum,der=zur
behind|hinter|dat|place,thing|
next to|neben|dat|place,thing,animate|
under|unter|dat|thing,place|
on|auf|dat|thing|
with|mit|dat|animate,thing|
without|ohne|acc|animate,thing|
for|für|acc|animate|
through|durch|acc|place|
"""

# subject pronouns: en, de, person ("you" is left out: du / ihr / Sie would be ambiguous)
PRONOUNS = (("I", "ich", "1sg"), ("he", "er", "3sg"), ("she", "sie", "3sg"),
            ("it", "es", "3sg"), ("we", "wir", "pl"), ("they", "sie", "pl"))

# ---- German morphology -----------------------------------------------------------------------
PERSON = {"1sg": 0, "3sg": 1, "pl": 2}
DE_AUX = {"haben": ("habe", "hat", "haben"), "sein": ("bin", "ist", "sind"),
          "werden": ("werde", "wird", "werden"), "können": ("kann", "kann", "können")}
EN_AUX = {"have": ("have", "has", "have"), "be": ("am", "is", "are"),
          "do": ("do", "does", "do")}
DEF = {"nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
       "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
       "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "den"}}
DIES_END = {"nom": {"m": "er", "f": "e", "n": "es", "pl": "e"},
            "acc": {"m": "en", "f": "e", "n": "es", "pl": "e"},
            "dat": {"m": "em", "f": "er", "n": "em", "pl": "en"}}
EIN_END = {"nom": {"m": "", "f": "e", "n": "", "pl": "e"},
           "acc": {"m": "en", "f": "e", "n": "", "pl": "e"},
           "dat": {"m": "em", "f": "er", "n": "em", "pl": "en"}}
STRONG_PL = {"nom": "e", "acc": "e", "dat": "en"}
ADJ_END = {  # adjective endings by declension class (after which determiner)
    "weak": {"nom": {"m": "e", "f": "e", "n": "e", "pl": "en"},
             "acc": {"m": "en", "f": "e", "n": "e", "pl": "en"},
             "dat": {"m": "en", "f": "en", "n": "en", "pl": "en"}},
    "mixed": {"nom": {"m": "er", "f": "e", "n": "es", "pl": "en"},
              "acc": {"m": "en", "f": "e", "n": "es", "pl": "en"},
              "dat": {"m": "en", "f": "en", "n": "en", "pl": "en"}},
    "strong": {"nom": {"pl": "e"}, "acc": {"pl": "e"}, "dat": {"pl": "en"}},
}
# determiners: key -> (en singular, en plural, German kind, German stem); None = not allowed
DETERMINERS = {
    "the": ("the", "the", "def", ""), "a": ("a", None, "ein", "ein"),
    "this": ("this", "these", "dies", "dies"), "my": ("my", "my", "ein", "mein"),
    "his": ("his", "his", "ein", "sein"), "her": ("her", "her", "ein", "ihr"),
    "our": ("our", "our", "ein", "unser"), "their": ("their", "their", "ein", "ihr"),
    "bare": (None, "", "bare", ""), "two": (None, "two", "num", "zwei"),
    "three": (None, "three", "num", "drei"), "many": (None, "many", "viel", "viel"),
}
ADJ_CLASS = {"def": "weak", "dies": "weak", "ein": "mixed", "bare": "strong",
             "num": "strong", "viel": "strong"}
SG_DETS = (("the", 45), ("a", 25), ("this", 8), ("my", 5), ("his", 5), ("her", 4),
           ("our", 4), ("their", 4))
PL_DETS = (("the", 35), ("bare", 20), ("this", 8), ("two", 6), ("three", 4), ("many", 5),
           ("my", 6), ("his", 4), ("her", 4), ("our", 4), ("their", 4))
TENSES = (("pres", 50), ("perf", 25), ("fut", 13), ("can", 12))
TENSE_LABELS = {"pres": "present", "perf": "perfect", "fut": "future", "can": "modal"}  # make_tense_splits' classes
MAIN_FRAMES = frozenset({"intr", "acc", "dat", "ditr", "clause"})
SUB_FRAMES = MAIN_FRAMES - {"clause"}  # no dass-clause inside another clause
RELATIVE_FRAMES = frozenset({"intr", "acc", "dat"})  # relative clauses stay short
