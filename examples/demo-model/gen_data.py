#!/usr/bin/env python3
"""Seeded generator of the demo model's synthetic training data.

Each example is one ChatML conversation (the exact text exlagent's `chatml` template renders):
  * extraction: system = instructions + a JSON Schema, user = a short document, assistant = the JSON;
  * tool use: system + <tools>, user question, assistant <tool_call>, tool response, assistant answer.
Output: JSON lines {"kind", "schema", "messages", "tools", "answer"} (answer: the expected object for
extraction examples). Standard library only; the same seed always gives the same file.

    python3 gen_data.py --seed 1 --count 1000 --out train.jsonl
"""
import argparse
import json
import random

FIRST = ("Alice Bob Carla David Elena Farid Grace Hugo Irene Jonas Keiko Liam Maria Noah Olga Pedro Quinn "
         "Rosa Samir Tara Umar Vera Wei Xenia Yusuf Zoe Anna Ben Chloe Diego Emma Felix Hana Ivan Julia Karl "
         "Lena Marco Nina Oscar Priya Ravi Sofia Tom Ursula Victor Wendy Yara Amir Beatrice Chen Dmitri Eva "
         "Fatima George Helga Ingrid Jamal Kofi Lucia Mei Nadia Omar Paula Rafael Sven Tariq Uma").split()
LAST = ("Smith Garcia Mueller Rossi Tanaka Kim Nguyen Silva Novak Larsen Okafor Dubois Kowalski Jensen Costa "
        "Moreau Fischer Haddad Ivanova Lindqvist Moreno Patel Quispe Romero Schmidt Torres Varga Wagner Yilmaz "
        "Zhang Andersen Becker Castillo Dahl Eriksen Ferrari Gomez Hansen Ito Jovanovic Keller Lopez Martin "
        "Nakamura Olsen Petrov Reyes Santos Berg Ahmed Brennan Carter Dalton Ellis").split()
CITIES = [("Lisbon", "Portugal"), ("Berlin", "Germany"), ("Oslo", "Norway"), ("Madrid", "Spain"),
          ("Toronto", "Canada"), ("Denver", "United States"), ("Osaka", "Japan"), ("Lyon", "France"),
          ("Krakow", "Poland"), ("Austin", "United States"), ("Milan", "Italy"), ("Dublin", "Ireland"),
          ("Porto", "Portugal"), ("Munich", "Germany"), ("Seattle", "United States"), ("Vienna", "Austria"),
          ("Zurich", "Switzerland"), ("Prague", "Czechia"), ("Seoul", "South Korea"), ("Nairobi", "Kenya"),
          ("Lima", "Peru"), ("Quito", "Ecuador"), ("Perth", "Australia"), ("Bergen", "Norway"),
          ("Ghent", "Belgium"), ("Leeds", "United Kingdom"), ("Boston", "United States"), ("Kyoto", "Japan"),
          ("Turin", "Italy"), ("Valencia", "Spain"), ("Hamburg", "Germany"), ("Gothenburg", "Sweden")]
STREETS = ("Oak Maple Cedar Elm Pine Birch Willow Harbor River Hill Park Lake Station Market Church Mill Bridge "
           "Garden Forest Meadow Sunset Spring Castle Valley").split()
STREET_KINDS = ["Street", "Avenue", "Road", "Lane", "Boulevard", "Way"]
JOBS = ["engineer", "teacher", "nurse", "architect", "chef", "accountant", "pilot", "designer", "lawyer",
        "pharmacist", "journalist", "electrician", "photographer", "librarian", "dentist", "translator"]
CO_A = ("Blue North Silver Bright Iron Green Rapid Solar Quantum Crystal Summit Harbor Atlas Nova Vertex "
        "Apex Cedar Falcon Orbit Pioneer").split()
CO_B = ("Logistics Systems Foods Robotics Analytics Energy Textiles Labs Pharma Software Motors Media Capital "
        "Networks Materials Studios").split()
CO_SUFFIX = ["Inc.", "Ltd.", "GmbH", "Group", "Corp.", "S.A."]
INDUSTRIES = ["logistics", "software", "food", "robotics", "energy", "textiles", "pharmaceuticals", "media",
              "finance", "telecommunications", "materials", "automotive"]
PRODUCTS = ["backpack", "desk lamp", "coffee grinder", "headphones", "office chair", "water bottle", "keyboard",
            "rain jacket", "blender", "monitor", "tent", "bicycle helmet", "kettle", "running shoes", "speaker"]
COLORS = ["black", "white", "red", "blue", "green", "grey", "silver", "orange", "yellow", "purple"]
CURRENCIES = [("USD", "$", "dollars"), ("EUR", "€", "euros"), ("GBP", "£", "pounds")]
MONTHS = ["January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December"]
FILLER = [
    "The matter was discussed again at the end of the quarter.",
    "No further changes were requested at that time.",
    "Several colleagues attended the meeting as well.",
    "The weather that week was unusually mild.",
    "A follow-up note was filed with the records office.",
    "Everyone agreed that the schedule looked reasonable.",
    "This summary was prepared for internal use only.",
    "Questions can be sent to the front desk.",
]

SYSTEM_EXTRACT = ("You extract structured data. Read the user's document and answer with one JSON object that "
                  "matches this JSON Schema. Copy names exactly, write dates as YYYY-MM-DD and amounts as "
                  "numbers. Answer with the JSON only.\n\nSchema:\n")


def schema_of(props):
    """A JSON Schema object for (name, type) pairs, all required, in order."""
    p = {}
    for name, typ in props:
        p[name] = {"type": typ} if typ != "date" else {"type": "string", "format": "date"}
    return {"type": "object", "properties": p, "required": [n for n, _ in props]}


def fmt_date(rng, y, m, d):
    style = rng.randrange(4)
    if style == 0:
        return f"{MONTHS[m - 1]} {d}, {y}"
    if style == 1:
        return f"{d} {MONTHS[m - 1]} {y}"
    if style == 2:
        return f"{y}-{m:02d}-{d:02d}"
    return f"{MONTHS[m - 1][:3]} {d}, {y}"


def rand_date(rng, lo=1990, hi=2025):
    return rng.randint(lo, hi), rng.randint(1, 12), rng.randint(1, 28)


def fmt_amount(rng, value, cur):
    code, sym, word = cur
    whole = f"{value:,.2f}" if rng.random() < 0.5 else f"{value:.2f}"
    style = rng.randrange(3)
    if style == 0:
        return f"{sym}{whole}"
    if style == 1:
        return f"{whole} {code}"
    return f"{whole} {word}"


def rand_amount(rng):
    cents = rng.choice([0, 0, 50, 99, rng.randint(1, 99)])
    return round(rng.randint(5, 9999) + cents / 100, 2)


def person_name(rng):
    return f"{rng.choice(FIRST)} {rng.choice(LAST)}"


def company_name(rng):
    return f"{rng.choice(CO_A)} {rng.choice(CO_B)} {rng.choice(CO_SUFFIX)}"


def shuffle_join(rng, sentences):
    rng.shuffle(sentences)
    if rng.random() < 0.5:
        sentences.insert(rng.randrange(len(sentences) + 1), rng.choice(FILLER))
    return " ".join(sentences)


def doc_person(rng):
    name = person_name(rng)
    first = name.split()[0]
    age = rng.randint(19, 88)
    city, country = rng.choice(CITIES)
    job = rng.choice(JOBS)
    email = f"{first.lower()}.{name.split()[1].lower()}{rng.randint(1, 99)}@{rng.choice(['mail.com', 'example.org', 'post.net'])}"
    s = [rng.choice([f"{name} is a {age}-year-old {job}.", f"{name}, aged {age}, works as a {job}.",
                     f"Meet {name}, a {job} who is {age} years old."]),
         rng.choice([f"{first} lives in {city}, {country}.", f"Home for {first} is {city}.",
                     f"{first} moved to {city} some years ago."]),
         rng.choice([f"{first} can be reached at {email}.", f"Contact: {email}.", f"Her or his email is {email}."])]
    obj = {"name": name, "age": age, "occupation": job, "city": city, "email": email}
    props = [("name", "string"), ("age", "integer"), ("occupation", "string"), ("city", "string"), ("email", "string")]
    return shuffle_join(rng, s), props, obj


def doc_company(rng):
    co = company_name(rng)
    ceo = person_name(rng)
    year = rng.randint(1950, 2022)
    city, country = rng.choice(CITIES)
    staff = rng.choice([rng.randint(5, 999), rng.randint(1000, 90000)])
    ind = rng.choice(INDUSTRIES)
    staff_txt = f"{staff:,}" if rng.random() < 0.5 else str(staff)
    s = [rng.choice([f"{co} was founded in {year}.", f"Founded in {year}, {co} works in {ind}.",
                     f"{co} has been in business since {year}."]),
         rng.choice([f"Its headquarters are in {city}, {country}.", f"The company is based in {city}.",
                     f"{co} is headquartered in {city}."]),
         rng.choice([f"The chief executive is {ceo}.", f"{ceo} serves as CEO.", f"It is led by CEO {ceo}."]),
         rng.choice([f"It employs {staff_txt} people.", f"The firm has {staff_txt} employees.",
                     f"Headcount stands at {staff_txt}."]),
         f"The company operates in the {ind} sector."]
    obj = {"company": co, "founded": year, "headquarters": city, "ceo": ceo, "employees": staff, "industry": ind}
    props = [("company", "string"), ("founded", "integer"), ("headquarters", "string"), ("ceo", "string"),
             ("employees", "integer"), ("industry", "string")]
    return shuffle_join(rng, s), props, obj


def doc_invoice(rng):
    num = f"{rng.choice(['INV', 'A', 'NR', 'BX'])}-{rng.randint(1000, 99999)}"
    cust = rng.choice([person_name(rng), company_name(rng)])
    y, m, d = rand_date(rng, 2015, 2025)
    amount = rand_amount(rng)
    cur = rng.choice(CURRENCIES)
    s = [rng.choice([f"Invoice {num} was issued to {cust}.", f"{cust} received invoice {num}.",
                     f"Billing reference {num} is addressed to {cust}."]),
         rng.choice([f"The invoice is dated {fmt_date(rng, y, m, d)}.", f"It was sent on {fmt_date(rng, y, m, d)}.",
                     f"Issue date: {fmt_date(rng, y, m, d)}."]),
         rng.choice([f"The total due is {fmt_amount(rng, amount, cur)}.", f"Amount payable: {fmt_amount(rng, amount, cur)}.",
                     f"Please pay {fmt_amount(rng, amount, cur)} within 30 days."])]
    obj = {"invoice_number": num, "customer": cust, "date": f"{y:04d}-{m:02d}-{d:02d}", "amount": amount,
           "currency": cur[0]}
    props = [("invoice_number", "string"), ("customer", "string"), ("date", "date"), ("amount", "number"),
             ("currency", "string")]
    return shuffle_join(rng, s), props, obj


def doc_address(rng):
    name = person_name(rng)
    num = rng.randint(1, 480)
    street = f"{rng.choice(STREETS)} {rng.choice(STREET_KINDS)}"
    city, country = rng.choice(CITIES)
    postal = str(rng.randint(1000, 99999)).zfill(5) if rng.random() < 0.7 else f"{rng.randint(10, 99)}-{rng.randint(100, 999)}"
    y, m, d = rand_date(rng, 2000, 2025)
    s = [rng.choice([f"Please ship the parcel to {name}, {num} {street}, {postal} {city}, {country}.",
                     f"{name} lives at {num} {street}, {city} {postal}, {country}.",
                     f"New address for {name}: {num} {street}, {postal} {city} ({country})."]),
         rng.choice([f"The move happened on {fmt_date(rng, y, m, d)}.", f"This address is valid from {fmt_date(rng, y, m, d)}."])]
    obj = {"recipient": name, "street": f"{num} {street}", "postal_code": postal, "city": city, "country": country,
           "since": f"{y:04d}-{m:02d}-{d:02d}"}
    props = [("recipient", "string"), ("street", "string"), ("postal_code", "string"), ("city", "string"),
             ("country", "string"), ("since", "date")]
    return shuffle_join(rng, s), props, obj


def doc_product(rng):
    prod = rng.choice(PRODUCTS)
    brand = f"{rng.choice(CO_A)}{rng.choice(['', 'Tech', 'Gear', 'Home', 'Works'])}"
    color = rng.choice(COLORS)
    price = rand_amount(rng)
    cur = rng.choice(CURRENCIES)
    sku = f"{rng.choice('ABCDEFGHKLMNPRSTX')}{rng.choice('ABCDEFGHKLMNPRSTX')}-{rng.randint(100, 9999)}"
    stock = rng.randint(0, 500)
    s = [rng.choice([f"The {color} {prod} from {brand} costs {fmt_amount(rng, price, cur)}.",
                     f"{brand} sells a {color} {prod} for {fmt_amount(rng, price, cur)}.",
                     f"Now available: the {brand} {prod} in {color}, priced at {fmt_amount(rng, price, cur)}."]),
         rng.choice([f"Its SKU is {sku}.", f"Item code {sku}.", f"Order it with reference {sku}."]),
         rng.choice([f"There are {stock} units in stock.", f"The warehouse holds {stock} units.",
                     f"Stock level: {stock}."])]
    obj = {"product": prod, "brand": brand, "color": color, "price": price, "currency": cur[0], "sku": sku,
           "in_stock": stock}
    props = [("product", "string"), ("brand", "string"), ("color", "string"), ("price", "number"),
             ("currency", "string"), ("sku", "string"), ("in_stock", "integer")]
    return shuffle_join(rng, s), props, obj


def doc_event(rng):
    who = person_name(rng)
    co = company_name(rng)
    y, m, d = rand_date(rng, 2018, 2026)
    city, _ = rng.choice(CITIES)
    attendees = rng.randint(3, 400)
    title = rng.choice(["annual review", "product launch", "board meeting", "team workshop", "client visit",
                        "training day", "budget meeting"])
    s = [rng.choice([f"The {title} of {co} takes place on {fmt_date(rng, y, m, d)}.",
                     f"On {fmt_date(rng, y, m, d)}, {co} holds its {title}."]),
         rng.choice([f"It will be held in {city}.", f"The venue is in {city}."]),
         rng.choice([f"{who} is the organizer.", f"Organized by {who}."]),
         rng.choice([f"About {attendees} people are expected.", f"{attendees} guests have registered."])]
    obj = {"event": title, "organization": co, "date": f"{y:04d}-{m:02d}-{d:02d}", "city": city,
           "organizer": who, "attendees": attendees}
    props = [("event", "string"), ("organization", "string"), ("date", "date"), ("city", "string"),
             ("organizer", "string"), ("attendees", "integer")]
    return shuffle_join(rng, s), props, obj


DOCS = [doc_person, doc_company, doc_invoice, doc_address, doc_product, doc_event]


def subset_props(rng, props, obj):
    """Sometimes ask for a subset of the fields, keeping their order."""
    if rng.random() < 0.7:
        return props, obj
    k = rng.randint(2, len(props))
    keep = sorted(rng.sample(range(len(props)), k))
    props = [props[i] for i in keep]
    return props, {n: obj[n] for n, _ in props}


def extraction_example(rng):
    doc, props, obj = rng.choice(DOCS)(rng)
    props, obj = subset_props(rng, props, obj)
    schema = schema_of(props)
    system = SYSTEM_EXTRACT + json.dumps(schema)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": doc},
                {"role": "assistant", "content": json.dumps(obj, ensure_ascii=False)}]
    return {"kind": "extract", "schema": schema, "messages": messages, "tools": [], "answer": obj}


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "convert_currency", "description": "Convert an amount of money",
     "parameters": {"type": "object", "properties": {"amount": {"type": "number"}, "from": {"type": "string"},
                                                     "to": {"type": "string"}}, "required": ["amount", "from", "to"]}}},
    {"type": "function", "function": {"name": "lookup_company", "description": "Facts about a company",
     "parameters": {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}}},
]


def tool_example(rng):
    kind = rng.randrange(3)
    if kind == 0:
        city, _ = rng.choice(CITIES)
        q = rng.choice([f"What is the weather like in {city}?", f"Is it cold in {city} right now?",
                        f"Weather in {city} please."])
        args = {"city": city}
        temp = rng.randint(-10, 35)
        sky = rng.choice(["sunny", "cloudy", "rainy", "windy", "snowing"])
        result = {"city": city, "temperature_c": temp, "sky": sky}
        answer = f"It is {temp} degrees Celsius and {sky} in {city}."
    elif kind == 1:
        amount = rand_amount(rng)
        a, b = rng.sample(CURRENCIES, 2)
        q = rng.choice([f"Convert {amount} {a[0]} to {b[0]}.", f"How much is {amount} {a[0]} in {b[0]}?"])
        args = {"amount": amount, "from": a[0], "to": b[0]}
        out = round(amount * rng.uniform(0.7, 1.4), 2)
        result = {"amount": out, "currency": b[0]}
        answer = f"{amount} {a[0]} is about {out} {b[0]}."
    else:
        co = company_name(rng)
        q = rng.choice([f"What do you know about {co}?", f"Tell me about {co}."])
        args = {"name": co}
        city, _ = rng.choice(CITIES)
        year = rng.randint(1950, 2022)
        result = {"name": co, "founded": year, "headquarters": city}
        answer = f"{co} was founded in {year} and is headquartered in {city}."
    name = ["get_weather", "convert_currency", "lookup_company"][kind]
    tools = rng.sample(TOOLS, rng.randint(1, 3))
    if TOOLS[kind] not in tools:
        tools.append(TOOLS[kind])
    messages = [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": q},
                {"role": "assistant", "content": "", "tool_calls": [{"name": name, "arguments": args}]},
                {"role": "tool", "content": json.dumps(result)},
                {"role": "assistant", "content": answer}]
    return {"kind": "tool", "schema": None, "messages": messages, "tools": tools, "answer": None}


def render_chatml(messages, tools, add_generation_prompt=False):
    """The prompt text of exlagent's chatml template (sessions/chat_template_chatml.cpp), byte for byte."""
    out = ""
    system = messages[0]["content"] if messages and messages[0]["role"] == "system" else ""
    first_is_system = bool(messages) and messages[0]["role"] == "system"
    if tools:
        out += "<|im_start|>system\n" + system + ("\n\n" if system else "")
        out += ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>")
        for t in tools:
            out += "\n" + json.dumps(t)
        out += ("\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                "<args-json-object>}\n</tool_call><|im_end|>\n")
    elif first_is_system:
        out += "<|im_start|>system\n" + system + "<|im_end|>\n"
    pieces = []  # (text, trained) pairs
    pieces.append((out, False))
    msgs = messages[1:] if first_is_system else messages
    for i, m in enumerate(msgs):
        if m["role"] == "assistant":
            text = m["content"]
            for c in m.get("tool_calls", []):
                text += ("\n" if text else "") + "<tool_call>\n{\"name\": \"" + c["name"] + "\", \"arguments\": " + \
                    json.dumps(c["arguments"]) + "}\n</tool_call>"
            pieces.append(("<|im_start|>assistant\n", False))
            pieces.append((text + "<|im_end|>", True))
            pieces.append(("\n", False))
        elif m["role"] == "tool":
            s = ""
            if i == 0 or msgs[i - 1]["role"] != "tool":
                s += "<|im_start|>user"
            s += "\n<tool_response>\n" + m["content"] + "\n</tool_response>"
            if i + 1 == len(msgs) or msgs[i + 1]["role"] != "tool":
                s += "<|im_end|>\n"
            pieces.append((s, False))
        else:
            pieces.append(("<|im_start|>" + m["role"] + "\n" + m["content"] + "<|im_end|>\n", False))
    if add_generation_prompt:
        pieces.append(("<|im_start|>assistant\n", False))
    return pieces


def generate(seed, count, tool_fraction=0.15):
    rng = random.Random(seed)
    for _ in range(count):
        yield tool_example(rng) if rng.random() < tool_fraction else extraction_example(rng)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--tool-fraction", type=float, default=0.15)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    with open(a.out, "w", encoding="utf-8") as f:
        for ex in generate(a.seed, a.count, a.tool_fraction):
            f.write(json.dumps(ex, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
