
QuestLedgerDB = {
	["profileKeys"] = {
		["Mira - Argent Dawn"] = "Mira - Argent Dawn",
	},
	["profiles"] = {
		["Mira - Argent Dawn"] = {
			["schema"] = 2,
			["partyCache"] = {
				["Party-3676-0A1B2C3D"] = {
					["members"] = 2,
				},
			},
			["history"] = {
				[84001] = "2026-10-30",
				[84117] = "2026-10-31",
			},
		},
	},
}
