"""The apps of the mobile sandbox, declared as data: entities (tables) with typed fields and value pools.

Everything else is generated from these declarations: SQLite tables, persona worlds, the table-operation
tools (search/get/create/update/delete), their JSON Schemas, and the generic task templates.
"""
from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class Field:
    """One column. `type`: str|int|num|bool|date|time|enum. `pool` names the value source for worlds/tasks."""

    name: str
    type: str
    pool: str = ""
    req: bool = False  # required on create
    label: str = ""  # words used in instructions
    enum: tuple[str, ...] = ()
    ref: str = ""  # entity name this id refers to
    derive: tuple[str, str] = ("", "")  # (ref field, field of the referenced row) copied on create
    lo: float | None = None
    hi: float | None = None
    updatable: bool = True

    @property
    def words(self) -> str:
        return self.label or self.name.replace("_", " ")

    @property
    def derived(self) -> bool:
        return bool(self.derive[0])


@dataclasses.dataclass(frozen=True)
class Entity:
    """A table of an app. `ops` is a subset of "sgcud" (search, get, create, update, delete)."""

    name: str
    plural: str
    app: str
    domain: str
    label: str
    fields: tuple[Field, ...]
    title: str
    search: tuple[str, ...] = ()
    summary: tuple[str, ...] = ()
    ops: str = "sgcud"
    n: int = 6
    online: bool = False  # needs network (wifi or cellular, not airplane mode)

    @property
    def table(self) -> str:
        return f"{self.app}_{self.plural}"

    def field(self, name: str) -> Field:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(f"{self.name} has no field {name!r}")


def F(name: str, type_: str, pool: str = "", req: bool = False, label: str = "", **kw: Any) -> Field:
    return Field(name=name, type=type_, pool=pool or name, req=req, label=label, **kw)


def E(name: str, plural: str, app: str, domain: str, label: str, fields: list[Field], title: str, **kw: Any) -> Entity:
    kw.setdefault("search", (title,))
    kw.setdefault("summary", (title,))
    return Entity(name=name, plural=plural, app=app, domain=domain, label=label, fields=tuple(fields), title=title, **kw)


FIRST = ["Alex", "Sam", "Jordan", "Taylor", "Morgan", "Riley", "Casey", "Jamie", "Priya", "Wei", "Lena", "Omar",
         "Sofia", "Mateo", "Hana", "Noah", "Ines", "Tariq", "Maya", "Lucas", "Zoe", "Ivan", "Amara", "Kenji",
         "Dana", "Felix", "Grace", "Hugo", "Nadia", "Owen", "Ruth", "Yusuf"]
LAST = ["Moreno", "Chen", "Okafor", "Schmidt", "Kowalski", "Haddad", "Nguyen", "Rossi", "Silva", "Larsen",
        "Patel", "Dubois", "Tanaka", "Novak", "Fischer", "Reyes", "Walsh", "Ibrahim", "Costa", "Meyer",
        "Whitfield", "Lindqvist", "Abara", "Brennan"]
CITIES = ["Lisbon", "Berlin", "Tokyo", "Toronto", "Sydney", "Nairobi", "Chicago", "Madrid", "Seoul", "Denver",
          "Dublin", "Oslo", "Austin", "Milan", "Lima", "Cairo"]
STREETS = ["Oak Street", "Harbor Road", "Maple Avenue", "King Street", "Mill Lane", "Station Road", "Elm Court",
           "River Walk", "Park Avenue", "Cedar Drive", "Hill Road", "Bay Street"]

POOLS: dict[str, list[Any]] = {
    "group": ["Family", "Book Club", "Running Crew", "Work Team", "Neighbors", "College Friends", "Band", "Chess Club"],
    "description": ["weekly catch-up", "shared plans", "weekend trips", "project updates", "birthday planning",
                    "game nights", "carpool", "volunteering"],
    "relation": ["friend", "family", "colleague", "neighbor"],
    "company": ["Northwind", "Acme Labs", "Globex", "Initech", "Umbrella Foods", "Stark Logistics", "Hooli",
                "Vandelay Imports", "Soylent", "Wayne Health"],
    "reason": ["spam", "telemarketing", "unknown caller", "robocall", "scam"],
    "reply": ["On my way!", "Running 10 minutes late.", "Can I call you back?", "Sounds good, see you then.",
              "In a meeting, will text later.", "Thanks so much!", "Happy birthday!", "Call me when you can."],
    "subject": ["Quarterly report", "Dinner on Friday", "Flight itinerary", "Invoice 2231", "Team offsite",
                "Lease renewal", "Photos from the trip", "Book recommendations", "Gym membership", "Project kickoff",
                "Conference tickets", "Recipe you asked for", "Weekend plans", "Volunteer schedule",
                "Course registration", "Car service reminder", "Garden club minutes", "Tax documents"],
    "body": ["Let me know what you think.", "See the details below.", "Looking forward to it.",
             "Please review before Monday.", "Thanks for your help last week.", "Can we move this to next week?",
             "Attached is the latest version.", "Call me if anything changes."],
    "event_title": ["Dentist appointment", "Team standup", "Yoga class", "Lunch with Priya", "Parent meeting",
                    "Piano lesson", "Budget review", "Haircut", "Book club", "Car service", "Job interview",
                    "Vet visit", "Sprint planning", "Dinner party", "Guitar practice", "Tennis match",
                    "Physio session", "Museum tour", "Board game night", "Coffee with mentor", "Flu shot",
                    "Design review", "Farmers market", "Movie night"],
    "location": ["Room 4B", "City Library", "Central Park", "Downtown Clinic", "Cafe Lumen", "Office HQ",
                 "Community Hall", "Main Street Gym", "Riverside Studio", "Online"],
    "note_text": ["Bring the blue folder.", "Ask about the warranty.", "Confirm by Thursday.", "Pay at the desk.",
                  "Parking is behind the building.", "Take the 8:15 train.", "Wear comfortable shoes."],
    "reminder_title": ["Pay the electricity bill", "Call grandma", "Buy birthday card", "Renew passport",
                       "Water the plants", "Submit expense report", "Book flights", "Return library books",
                       "Pick up dry cleaning", "Schedule eye exam", "Back up laptop", "Order printer ink",
                       "Cancel free trial", "Send thank-you notes", "Check tire pressure", "Refill prescription",
                       "Update resume", "Clean the gutters", "Buy cat food", "Defrost the freezer"],
    "list_name": ["Personal", "Work", "Errands", "Home"],
    "alarm_label": ["Wake up", "Gym", "Medication", "School run", "Standup", "Meditation", "Laundry",
                    "Pick up kids", "Bedtime", "Water plants"],
    "timer_label": ["Pasta", "Tea", "Laundry", "Oven", "Workout", "Nap", "Parking meter", "Eggs"],
    "tz_city": CITIES,
    "note_title": ["Packing list", "Gift ideas", "Meeting notes", "Recipe: lentil soup", "Book list",
                   "Garden plan", "Wifi passwords", "Workout plan", "Trip ideas", "Home repairs", "Budget 2026",
                   "Podcast ideas", "Bucket list", "Class notes", "Movie list", "Groceries", "Birthday plans",
                   "Project ideas", "Quotes", "Car maintenance", "Interview prep", "Reading notes"],
    "folder": ["Personal", "Work", "Travel", "Archive", "Recipes"],
    "item_text": ["Buy stamps", "Fix the shelf", "Email the landlord", "Book a babysitter", "Sort old photos",
                  "Oil the bike chain", "Return the drill", "Clean the oven", "Renew parking permit",
                  "Print boarding pass", "Charge the camera", "Pack sunscreen"],
    "file_name": ["resume.pdf", "budget.xlsx", "lease.pdf", "passport_scan.jpg", "thesis.docx", "invoice_2231.pdf",
                  "holiday.jpg", "notes.docx", "tax_return.pdf", "playlist.mp3", "recipe.docx", "floorplan.pdf",
                  "contract.pdf", "receipt_0412.jpg", "slides.pdf", "report_q1.docx", "insurance.pdf", "menu.pdf",
                  "boarding_pass.pdf", "voice_memo.mp3"],
    "file_kind": ["pdf", "doc", "image", "sheet", "audio"],
    "folder_name": ["Documents", "Downloads", "Pictures", "Music", "Receipts", "School", "Taxes", "Projects"],
    "color": ["red", "blue", "green", "yellow", "purple", "gray"],
    "place_name": ["Home", "Work", "Gym", "Mom's house", "Climbing hall", "Favorite cafe", "Pharmacy",
                   "School", "Dentist", "Airport", "Train station", "Grocery store"],
    "address": [f"{n} {s}" for n, s in zip(range(3, 99, 7), STREETS * 2)],
    "place_category": ["home", "work", "food", "gym", "other"],
    "poi": ["Blue Bottle Coffee", "City Museum", "Riverside Park", "Central Station", "Harbor Market",
            "Grand Cinema", "Sunset Pier", "Botanic Garden", "Old Town Square", "Science Center",
            "Public Library", "Skyline Tower", "Night Market", "Lakeside Zoo", "Union Hospital",
            "Westfield Mall", "Stadium North", "Art Gallery", "Ferry Terminal", "Opera House",
            "Central Pharmacy", "Fire Station 3"],
    "poi_category": ["cafe", "museum", "park", "transit", "shopping", "entertainment", "health"],
    "level": ["P1", "P2", "P3", "Ground", "Roof"],
    "ride_type": ["standard", "comfort", "xl"],
    "ride_status": ["completed", "cancelled", "booked"],
    "product": ["Oat Milk", "Espresso Beans", "Greek Yogurt", "Sourdough Bread", "Olive Oil", "Dark Chocolate",
                "Basmati Rice", "Almond Butter", "Green Tea", "Paper Towels", "Dish Soap", "AA Batteries",
                "Phone Charger", "Sunscreen SPF50", "Toothpaste", "Shampoo", "Granola", "Peanut Butter",
                "Sparkling Water", "Frozen Peas", "Cheddar Cheese", "Bananas", "Avocados", "Tomato Sauce",
                "Notebook", "Light Bulbs", "Laundry Detergent", "Hand Soap", "Coffee Filters", "Honey"],
    "brand": ["FreshCo", "Nordic", "Sunvale", "GreenLeaf", "Homely", "Brightline", "Valley Farms"],
    "product_category": ["grocery", "household", "electronics", "personal care", "stationery"],
    "store": ["FreshCo Market", "Corner Shop", "Hardware Depot", "Pharmacy"],
    "order_status": ["delivered", "shipped", "processing"],
    "restaurant": ["Luigi's Trattoria", "Sakura Sushi", "Taco Loco", "Green Bowl", "Bombay Spice", "Le Petit Bistro",
                   "Burger Barn", "Pho Saigon", "Falafel House", "Seoul Kitchen", "Pizza Napoli", "The Vegan Spot",
                   "Dim Sum Palace", "Athens Grill", "Casa Tapas", "Noodle Bar"],
    "cuisine": ["italian", "japanese", "mexican", "healthy", "indian", "french", "american", "vietnamese",
                "middle eastern", "korean", "greek", "spanish", "chinese"],
    "dish": ["Margherita pizza", "Salmon roll", "Chicken tacos", "Pad thai", "Butter chicken", "Caesar salad",
             "Veggie burger", "Beef pho", "Falafel wrap", "Bibimbap", "Lasagna", "Ramen"],
    "food_status": ["preparing", "on the way", "delivered"],
    "account_name": ["Everyday Checking", "Savings", "Travel Card"],
    "txn": ["Grocery store", "Coffee shop", "Electricity bill", "Gym membership", "Bookstore", "Gas station",
            "Streaming service", "Pharmacy", "Restaurant", "Salary", "Rent", "Phone bill", "Taxi", "Cinema",
            "Hardware store", "Bakery", "Parking", "Insurance", "Concert tickets", "Pet store"],
    "txn_category": ["food", "bills", "transport", "entertainment", "shopping", "income", "health"],
    "payee": ["Landlord Properties", "City Water", "Green Energy Co", "Sunrise Daycare", "Dr. Rossi Dental",
              "Northside Gym", "Allied Insurance", "Metro Telecom", "Piano School", "Tax Office"],
    "memo": ["monthly rent", "invoice 2231", "deposit", "membership fee", "thank you", "refund", "tuition"],
    "card_name": ["Blue Visa", "Travel Mastercard", "Grocery Debit"],
    "card_network": ["visa", "mastercard", "amex"],
    "bill_name": ["Electricity", "Internet", "Water", "Phone plan", "Car insurance", "Streaming bundle"],
    "airline": ["SkyWays", "Atlantic Air", "Nordic Jet", "Pacific Wings", "Sunline"],
    "seat_class": ["economy", "premium", "business"],
    "hotel": ["Harbor View Hotel", "Grand Central Inn", "The Linden", "Sunset Suites", "Old Town Lodge",
              "Parkside Hotel", "Riverside Rooms", "The Atrium", "Maple Guesthouse", "Summit Hotel",
              "Blue Door B&B", "City Loft Hotel", "Seaside Resort", "Garden Court Hotel"],
    "trip_name": ["Spring break", "Ski weekend", "Family reunion", "Conference trip", "Beach week",
                  "Road trip", "Honeymoon", "Hiking trip", "City break", "Wine tour"],
    "workout_kind": ["running", "cycling", "swimming", "yoga", "strength", "walking"],
    "medication": ["Vitamin D", "Ibuprofen", "Allergy tablets", "Iron supplement", "Omega-3", "Magnesium",
                   "Probiotic", "Antibiotic"],
    "dose": ["1 tablet", "2 tablets", "5 ml", "500 mg", "1 capsule"],
    "song": ["Midnight Drive", "Paper Planes", "Golden Hour", "Ocean Eyes", "City Lights", "Slow Burn",
             "Wildflower", "Neon Rain", "Northern Sky", "Heartbeat", "Fading Echo", "Summer Rain", "Blue Monday",
             "Sugar Rush", "Last Train", "Silver Lining", "Moonwalk", "Daydream", "Firefly", "Lighthouse",
             "Riverbend", "Afterglow", "Skyline", "Wanderer", "Thunder Road", "Velvet Night", "Open Roads",
             "Little Things", "Saturday Sun", "Quiet Storm", "Glass House", "Starlight"],
    "artist": ["The Lumens", "Nova Reyes", "Echo Park", "Mila Hart", "The Driftwood", "Kai Storm", "Luna Vale",
               "Blue Harbor", "Jonah Lee", "Satellite Kids"],
    "album": ["First Light", "Nightfall", "Horizons", "Paper Moon", "Wild Hearts", "Neon Dreams"],
    "genre": ["pop", "rock", "indie", "jazz", "electronic", "folk", "hip hop"],
    "playlist": ["Morning Run", "Focus", "Road Trip", "Chill Evening", "Party Mix", "Sleep", "Cooking",
                 "Throwbacks", "Rainy Day", "Workout Hits"],
    "podcast": ["Daily Brief", "Science Hour", "History Unplugged", "Money Talks", "Tech Weekly",
                "Mindful Minutes", "Sports Corner", "Story Time", "The Food Show", "Design Matters"],
    "publisher": ["Radio North", "Open Air Media", "Pod Co", "Studio Nine"],
    "album_name": ["Vacation 2025", "Family", "Pets", "Food", "Screenshots", "Concerts", "Hiking", "Birthday"],
    "photo": ["Beach sunset", "Birthday cake", "Dog in the park", "Mountain view", "Concert stage",
              "Family dinner", "City skyline", "Snowy street", "Garden flowers", "Coffee art", "Old bridge",
              "Lake reflection", "Street market", "Graduation", "Tall lighthouse"],
    "ssid": ["HomeNet", "Office-5G", "CafeLumen-Guest", "Library-Free", "AirportWiFi", "Gym-Members",
             "Hotel-Guest", "Neighbor-2.4", "TrainNet"],
    "security": ["wpa2", "wpa3", "open"],
    "bt_device": ["AirBeats Pro", "Kitchen Speaker", "Car Audio", "FitWatch 3", "Studio Headphones",
                  "Desk Speaker", "Running Buds"],
    "bt_kind": ["headphones", "speaker", "watch", "car"],
    "bookmark": ["Weather Radar", "Train Timetable", "Recipe Box", "News Daily", "Bank Login", "Online Course",
                 "Hiking Trails", "Tax Portal", "Library Catalog", "Language App", "Local Events", "Pet Supplies"],
}


def _person_fields() -> list[Field]:
    return [
        F("name", "str", "person", req=True),
        F("phone", "str", "phone", req=True, label="phone number"),
        F("email", "str", "email", label="email address"),
        F("relation", "enum", enum=tuple(POOLS["relation"])),
        F("company", "str"),
        F("birthday", "date", "birthday"),
    ]


ENTITIES: tuple[Entity, ...] = (
    # contacts
    E("contact", "contacts", "contacts", "contacts", "contact", _person_fields(), "name", n=24,
      summary=("name", "phone"), search=("name", "company")),
    E("contact_group", "contact_groups", "contacts", "contacts", "contact group",
      [F("name", "str", "group", req=True), F("description", "str")], "name", n=4),
    E("blocked_number", "blocked_numbers", "contacts", "contacts", "blocked number",
      [F("number", "str", "phone", req=True), F("reason", "str")], "number", n=3),
    # communication
    E("sms", "sms_messages", "messages", "communication", "text message",
      [F("contact_name", "str", "person", label="contact"), F("to_number", "str", "phone", label="number"),
       F("body", "str", "reply", label="text"), F("direction", "enum", enum=("in", "out")),
       F("sent_at", "str", "datetime", label="time")],
      "contact_name", ops="sg", n=16, search=("contact_name", "body"), summary=("contact_name", "body")),
    E("quick_reply", "quick_replies", "messages", "communication", "quick reply",
      [F("text", "str", "reply", req=True), F("shortcut", "str", "shortcut")], "text", n=3),
    E("email", "emails", "email", "communication", "email",
      [F("sender", "str", "email", label="sender"), F("recipient", "str", "email"),
       F("subject", "str", "subject"), F("body", "str"), F("folder", "enum", enum=("inbox", "sent", "archive")),
       F("received_at", "str", "datetime", label="time")],
      "subject", ops="sg", n=12, online=True, search=("subject", "sender"), summary=("subject", "sender")),
    E("email_draft", "email_drafts", "email", "communication", "email draft",
      [F("recipient", "str", "email", req=True), F("subject", "str", "subject", req=True),
       F("body", "str")], "subject", n=3, online=True),
    E("call", "calls", "phone", "communication", "call log entry",
      [F("contact_name", "str", "person", label="contact"), F("number", "str", "phone"),
       F("direction", "enum", enum=("in", "out", "missed")), F("duration_s", "int", "duration_s", label="duration in seconds"),
       F("at", "str", "datetime", label="time")],
      "contact_name", ops="sg", n=10, summary=("contact_name", "direction")),
    # calendar & reminders
    E("event", "events", "calendar", "calendar_reminders", "calendar event",
      [F("title", "str", "event_title", req=True), F("date", "date", req=True), F("start_time", "time", req=True, label="start time"),
       F("end_time", "time", label="end time"), F("location", "str"), F("notes", "str", "note_text")],
      "title", n=14, summary=("title", "date")),
    E("reminder", "reminders", "calendar", "calendar_reminders", "reminder",
      [F("title", "str", "reminder_title", req=True), F("due_date", "date", req=True, label="due date"),
       F("due_time", "time", label="due time"), F("done", "bool"), F("list_name", "enum", enum=tuple(POOLS["list_name"]), label="list")],
      "title", n=12, summary=("title", "due_date")),
    # clock & alarms
    E("alarm", "alarms", "clock", "clock_alarms", "alarm",
      [F("label", "str", "alarm_label", req=True), F("time", "time", req=True),
       F("enabled", "bool"), F("repeat", "enum", enum=("never", "daily", "weekdays", "weekends"))],
      "label", n=5, summary=("label", "time")),
    E("timer", "timers", "clock", "clock_alarms", "timer",
      [F("label", "str", "timer_label", req=True), F("duration_min", "int", "minutes", req=True, label="duration in minutes", lo=1, hi=600)],
      "label", n=2),
    E("world_clock", "world_clocks", "clock", "clock_alarms", "world clock",
      [F("city", "enum", "tz_city", req=True, enum=tuple(CITIES), updatable=False)], "city", ops="sgcd", n=3),
    # notes & files
    E("note", "notes", "notes", "notes_files", "note",
      [F("title", "str", "note_title", req=True), F("body", "str", "note_text"), F("folder", "enum", enum=tuple(POOLS["folder"])),
       F("pinned", "bool")], "title", n=14, search=("title", "body")),
    E("checklist_item", "checklist_items", "notes", "notes_files", "checklist item",
      [F("text", "str", "item_text", req=True), F("checked", "bool"), F("list_name", "enum", enum=tuple(POOLS["list_name"]), label="list")],
      "text", n=8),
    E("file", "files", "files", "notes_files", "file",
      [F("name", "str", "file_name", req=True), F("folder", "str", "folder_name"), F("size_kb", "int", "size_kb", label="size in KB"),
       F("kind", "enum", enum=tuple(POOLS["file_kind"]))], "name", n=14, summary=("name", "folder")),
    E("folder", "folders", "files", "notes_files", "folder",
      [F("name", "str", "folder_name", req=True), F("color", "enum", enum=tuple(POOLS["color"]))], "name", n=4),
    # navigation & rides
    E("saved_place", "saved_places", "maps", "navigation_rides", "saved place",
      [F("name", "str", "place_name", req=True), F("address", "str", req=True),
       F("category", "enum", enum=tuple(POOLS["place_category"]))], "name", n=8, summary=("name", "address")),
    E("place", "places", "maps", "navigation_rides", "place",
      [F("name", "str", "poi"), F("address", "str"), F("category", "enum", enum=tuple(POOLS["poi_category"])),
       F("rating", "num", "rating"), F("phone", "str", "phone")], "name", ops="sg", n=18, online=True),
    E("parking_spot", "parking_spots", "maps", "navigation_rides", "parking spot",
      [F("location", "str", "poi", req=True), F("level", "enum", enum=tuple(POOLS["level"])), F("note", "str", "note_text")],
      "location", n=2),
    E("ride", "rides", "rides", "navigation_rides", "ride",
      [F("pickup", "str", "address"), F("dropoff", "str", "poi"), F("ride_type", "enum", enum=tuple(POOLS["ride_type"]), label="ride type"),
       F("status", "enum", enum=tuple(POOLS["ride_status"])), F("fare", "num", "fare")],
      "dropoff", ops="sg", n=4, online=True, summary=("dropoff", "status")),
    # shopping & food
    E("product", "products", "shop", "shopping_food", "product",
      [F("name", "str", "product"), F("price", "num", "price"), F("category", "enum", enum=tuple(POOLS["product_category"])),
       F("brand", "str"), F("in_stock", "bool", label="stock status")], "name", ops="sg", n=26, online=True,
      summary=("name", "price")),
    E("cart_item", "cart_items", "shop", "shopping_food", "cart item",
      [F("product_id", "str", req=True, ref="product", updatable=False, label="product"),
       F("product_name", "str", derive=("product_id", "name"), updatable=False),
       F("quantity", "int", "qty", req=True, lo=1, hi=20)], "product_name", n=2, online=True),
    E("shopping_list_item", "shopping_list_items", "shop", "shopping_food", "shopping list item",
      [F("name", "str", "product", req=True), F("quantity", "int", "qty", lo=1, hi=20), F("store", "enum", enum=tuple(POOLS["store"]))],
      "name", n=6),
    E("order", "orders", "shop", "shopping_food", "order",
      [F("items", "str", "order_items"), F("total", "num", "price"), F("status", "enum", enum=tuple(POOLS["order_status"])),
       F("placed_on", "date", label="order date")], "items", ops="sg", n=3, online=True, summary=("items", "status")),
    E("restaurant", "restaurants", "food", "shopping_food", "restaurant",
      [F("name", "str", "restaurant"), F("cuisine", "enum", enum=tuple(POOLS["cuisine"])), F("rating", "num", "rating"),
       F("price_level", "enum", enum=("$", "$$", "$$$"), label="price level"), F("address", "str"), F("phone", "str", "phone")],
      "name", ops="sg", n=14, online=True, search=("name", "cuisine"), summary=("name", "cuisine")),
    E("food_order", "food_orders", "food", "shopping_food", "food order",
      [F("restaurant_id", "str", req=True, ref="restaurant", updatable=False, label="restaurant"),
       F("restaurant_name", "str", derive=("restaurant_id", "name"), updatable=False),
       F("dish", "str", req=True), F("quantity", "int", "qty", lo=1, hi=20), F("status", "enum", enum=tuple(POOLS["food_status"]), updatable=False)],
      "dish", ops="sgcd", n=2, online=True, search=("dish", "restaurant_name")),
    E("table_booking", "table_bookings", "food", "shopping_food", "table booking",
      [F("restaurant_id", "str", req=True, ref="restaurant", updatable=False, label="restaurant"),
       F("restaurant_name", "str", derive=("restaurant_id", "name"), updatable=False),
       F("date", "date", req=True), F("time", "time", req=True), F("party_size", "int", "party", req=True, lo=1, hi=20, label="party size")],
      "restaurant_name", n=2, online=True),
    # payments & banking
    E("account", "accounts", "bank", "payments_banking", "bank account",
      [F("name", "str", "account_name"), F("last4", "str", "last4", label="last four digits"), F("balance", "num", "balance"),
       F("currency", "enum", enum=("USD",))], "name", ops="sg", n=3, online=True, summary=("name", "balance")),
    E("transaction", "transactions", "bank", "payments_banking", "transaction",
      [F("description", "str", "txn"), F("amount", "num", "txn_amount"), F("date", "date"),
       F("category", "enum", enum=tuple(POOLS["txn_category"]))], "description", ops="sg", n=20, online=True,
      summary=("description", "date")),
    E("payee", "payees", "bank", "payments_banking", "payee",
      [F("name", "str", "payee", req=True), F("iban", "str", "iban", req=True, label="IBAN"), F("nickname", "str", "nickname")],
      "name", n=5, online=True),
    E("scheduled_payment", "scheduled_payments", "bank", "payments_banking", "scheduled payment",
      [F("payee_id", "str", req=True, ref="payee", updatable=False, label="payee"),
       F("payee_name", "str", derive=("payee_id", "name"), updatable=False),
       F("amount", "num", "pay_amount", req=True, lo=0.01, hi=2000), F("date", "date", req=True), F("memo", "str")],
      "payee_name", n=2, online=True),
    E("card", "cards", "wallet", "payments_banking", "payment card",
      [F("name", "str", "card_name", updatable=False), F("last4", "str", "last4", updatable=False, label="last four digits"),
       F("network", "enum", enum=tuple(POOLS["card_network"]), updatable=False), F("frozen", "bool")],
      "name", ops="sgu", n=3),
    E("payment_request", "payment_requests", "wallet", "payments_banking", "payment request",
      [F("from_name", "str", "person", req=True, label="person"), F("amount", "num", "pay_amount", req=True, lo=0.01, hi=2000),
       F("note", "str", "memo")], "from_name", ops="sgcd", n=2, online=True),
    E("bill", "bills", "wallet", "payments_banking", "bill",
      [F("name", "str", "bill_name"), F("amount", "num", "pay_amount"), F("due_date", "date", label="due date"),
       F("paid", "bool")], "name", ops="sg", n=4, online=True, summary=("name", "due_date")),
    # travel
    E("flight", "flights", "travel", "travel", "flight",
      [F("number", "str", "flight_no", label="flight number"), F("origin", "enum", enum=tuple(CITIES)),
       F("destination", "enum", enum=tuple(CITIES)), F("date", "date"), F("depart_time", "time", label="departure time"),
       F("airline", "str"), F("price", "num", "fare_big")], "number", ops="sg", n=24, online=True,
      search=("number", "origin", "destination", "airline"), summary=("number", "origin", "destination", "date")),
    E("flight_booking", "flight_bookings", "travel", "travel", "flight booking",
      [F("flight_id", "str", req=True, ref="flight", updatable=False, label="flight"),
       F("flight_number", "str", derive=("flight_id", "number"), updatable=False),
       F("passenger", "str", "person", req=True), F("seat_class", "enum", enum=tuple(POOLS["seat_class"]), label="seat class")],
      "flight_number", n=1, online=True, search=("flight_number", "passenger")),
    E("hotel", "hotels", "travel", "travel", "hotel",
      [F("name", "str", "hotel"), F("city", "enum", enum=tuple(CITIES)), F("price_per_night", "num", "fare", label="price per night"),
       F("rating", "num", "rating")], "name", ops="sg", n=12, online=True, search=("name", "city"), summary=("name", "city")),
    E("hotel_booking", "hotel_bookings", "travel", "travel", "hotel booking",
      [F("hotel_id", "str", req=True, ref="hotel", updatable=False, label="hotel"),
       F("hotel_name", "str", derive=("hotel_id", "name"), updatable=False),
       F("check_in", "date", req=True, label="check-in date"), F("nights", "int", "nights", req=True, lo=1, hi=30),
       F("guests", "int", "party", lo=1, hi=8)], "hotel_name", n=1, online=True),
    E("trip", "trips", "travel", "travel", "trip",
      [F("name", "str", "trip_name", req=True), F("destination", "enum", enum=tuple(CITIES), req=True),
       F("start_date", "date", label="start date"), F("end_date", "date", label="end date"), F("notes", "str", "note_text")],
      "name", n=2),
    # health & fitness
    E("workout", "workouts", "health", "health_fitness", "workout",
      [F("kind", "enum", enum=tuple(POOLS["workout_kind"]), req=True, label="activity"), F("date", "date", req=True),
       F("duration_min", "int", "minutes", req=True, lo=1, hi=600, label="duration in minutes"), F("calories", "int", "calories")],
      "kind", n=10, summary=("kind", "date")),
    E("weight_log", "weight_logs", "health", "health_fitness", "weight entry",
      [F("date", "date", req=True), F("weight_kg", "num", "weight", req=True, lo=20, hi=300, label="weight in kg")],
      "date", n=6, summary=("date", "weight_kg")),
    E("water_log", "water_logs", "health", "health_fitness", "water intake entry",
      [F("date", "date", req=True), F("amount_ml", "int", "water", req=True, lo=50, hi=5000, label="amount in ml")],
      "date", n=4, summary=("date", "amount_ml")),
    E("medication", "medications", "health", "health_fitness", "medication",
      [F("name", "str", "medication", req=True), F("dose", "str"), F("times_per_day", "int", "per_day", lo=1, hi=6, label="times per day"),
       F("time", "time", label="reminder time")], "name", n=3),
    E("sleep_log", "sleep_logs", "health", "health_fitness", "sleep entry",
      [F("date", "date", req=True), F("hours", "num", "sleep_hours", req=True, lo=0, hi=24)], "date", n=5,
      summary=("date", "hours")),
    # media
    E("song", "songs", "music", "media", "song",
      [F("title", "str", "song"), F("artist", "str"), F("album", "str"), F("duration_s", "int", "song_len", label="length in seconds"),
       F("genre", "enum", enum=tuple(POOLS["genre"]))], "title", ops="sg", n=30, search=("title", "artist"),
      summary=("title", "artist")),
    E("playlist", "playlists", "music", "media", "playlist",
      [F("name", "str", "playlist", req=True), F("description", "str")], "name", n=4),
    E("playlist_song", "playlist_songs", "music", "media", "playlist entry",
      [F("playlist_id", "str", req=True, ref="playlist", updatable=False, label="playlist"),
       F("playlist_name", "str", derive=("playlist_id", "name"), updatable=False),
       F("song_id", "str", req=True, ref="song", updatable=False, label="song"),
       F("song_title", "str", derive=("song_id", "title"), updatable=False)],
      "song_title", ops="sgcd", n=6, search=("song_title", "playlist_name"), summary=("song_title", "playlist_name")),
    E("podcast_subscription", "podcast_subscriptions", "podcasts", "media", "podcast subscription",
      [F("name", "str", "podcast", req=True), F("publisher", "str"), F("notify", "bool", label="new-episode alerts")],
      "name", n=3, online=True),
    E("album", "albums", "photos", "media", "photo album", [F("name", "str", "album_name", req=True)], "name", n=3),
    E("photo", "photos", "photos", "media", "photo",
      [F("caption", "str", "photo", updatable=False), F("taken_on", "date", updatable=False, label="date taken"),
       F("favorite", "bool"), F("album_name", "str", "album_name", label="album")], "caption", ops="sgu", n=12),
    # device settings
    E("wifi_network", "wifi_networks", "settings", "device_settings", "saved Wi-Fi network",
      [F("ssid", "str", "ssid", req=True, label="network name"), F("security", "enum", enum=tuple(POOLS["security"])),
       F("auto_join", "bool", label="auto-join")], "ssid", n=4),
    E("bluetooth_device", "bluetooth_devices", "settings", "device_settings", "Bluetooth device",
      [F("name", "str", "bt_device", updatable=False), F("kind", "enum", enum=tuple(POOLS["bt_kind"]), updatable=False),
       F("paired", "bool"), F("auto_connect", "bool", label="auto-connect")], "name", ops="sgud", n=4),
    # utilities
    E("bookmark", "bookmarks", "browser", "utilities", "bookmark",
      [F("title", "str", "bookmark", req=True), F("url", "str", "url", req=True, label="URL"),
       F("folder", "enum", enum=tuple(POOLS["folder"]))], "title", n=6),
    E("saved_conversion", "saved_conversions", "converter", "utilities", "saved conversion",
      [F("label", "str", "conv_label", req=True), F("expression", "str", "conv_expr", req=True)], "label", n=3),
)

POOLS["conv_label"] = ["Oven temperature", "Marathon distance", "Recipe flour", "Luggage limit", "Pool length",
                       "Bike tire", "Coffee ratio", "Room size"]
POOLS["conv_expr"] = ["180 C to F", "42.2 km to mi", "250 g to oz", "23 kg to lb", "50 m to ft", "28 in to cm",
                      "15 g to oz", "20 m2 to ft2"]
POOLS["shortcut"] = ["/omw", "/late", "/cb", "/ok", "/mtg", "/ty", "/hb", "/call"]
POOLS["nickname"] = ["rent", "water", "power", "daycare", "dentist", "gym", "insurance", "phone"]
POOLS["order_items"] = ["Oat Milk x2", "Phone Charger", "Paper Towels x3", "Olive Oil, Honey", "Notebook x4",
                        "Light Bulbs x6", "Granola, Bananas"]

ENTITY_BY_NAME: dict[str, Entity] = {e.name: e for e in ENTITIES}
APPS: tuple[str, ...] = tuple(dict.fromkeys(e.app for e in ENTITIES))


def id_prefix(entity: Entity) -> str:
    return entity.name
